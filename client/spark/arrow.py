"""The source's schema, and stored messages (as decoded from a pull body) made into Arrow batches.

A pull body is a run of msgpack arrays, one per message (PROTOCOL.md "Messages in a body"):

    [topic, queue_id, queue_offset, commit_log_offset, flag, sys_flag,
     born_timestamp, born_host, store_timestamp, store_host, reconsume_times, properties, body]

`record_batch` turns a list of those arrays into one `pyarrow.RecordBatch` whose schema is exactly
`ARROW_SCHEMA` (Spark rejects a batch whose Arrow schema differs in any type, nullability or field
name). `tags` and `keys` are the TAGS and KEYS properties; `properties` holds every other property
(UNIQ_KEY included); `msg_id` is the broker's offset message id (store host + commit log offset);
times are epoch ms on the wire and UTC microsecond timestamps here."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from protocol.message import PROPERTY_KEYS, PROPERTY_TAGS, msg_id_prefix

SCHEMA_DDL = ("topic string, queue_id int, queue_offset long, msg_id string, tags string, keys string, "
              "properties map<string,string>, body binary, born_timestamp timestamp, "
              "store_timestamp timestamp, reconsume_times int")
SCHEMA = StructType([
    StructField("topic", StringType()), StructField("queue_id", IntegerType()),
    StructField("queue_offset", LongType()), StructField("msg_id", StringType()),
    StructField("tags", StringType()), StructField("keys", StringType()),
    StructField("properties", MapType(StringType(), StringType())), StructField("body", BinaryType()),
    StructField("born_timestamp", TimestampType()), StructField("store_timestamp", TimestampType()),
    StructField("reconsume_times", IntegerType()),
])   # SCHEMA_DDL, built without a SparkSession (parsing DDL needs one)
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")   # what Spark's Python worker expects
_PROPERTIES_TYPE = ARROW_SCHEMA.field("properties").type
_TIMESTAMP_TYPE = ARROW_SCHEMA.field("born_timestamp").type
_OWN_COLUMNS = frozenset((PROPERTY_TAGS, PROPERTY_KEYS))


def _timestamps(epoch_ms: tuple[int, ...]) -> pa.Array:
    return pc.multiply(pa.array(epoch_ms, pa.int64()), 1_000).cast(_TIMESTAMP_TYPE)


def _properties(maps: tuple[dict[str, str], ...]) -> pa.Array:
    offsets, keys, values = [0], [], []
    for properties in maps:
        for key, value in properties.items():
            if key not in _OWN_COLUMNS:
                keys.append(key)
                values.append(value)
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()), type=_PROPERTIES_TYPE)


def record_batch(messages: list[list[Any]], prefixes: dict[str, str]) -> pa.RecordBatch:
    """One batch of `ARROW_SCHEMA` from stored-message arrays (shapes checked by the caller's
    decoder); `prefixes` caches the message id prefix of each store host across calls."""
    (topics, queue_ids, queue_offsets, commit_log_offsets, _, _, born, _, stored, store_hosts, reconsume,
     maps, bodies) = zip(*messages, strict=True)
    msg_ids = []
    for host, commit_log_offset in zip(store_hosts, commit_log_offsets, strict=True):
        prefix = prefixes.get(host)
        if prefix is None:
            prefix = prefixes[host] = msg_id_prefix(host)
        msg_ids.append(f"{prefix}{commit_log_offset:016X}")
    arrays = [
        pa.array(topics, pa.string()),
        pa.array(queue_ids, pa.int32()),
        pa.array(queue_offsets, pa.int64()),
        pa.array(msg_ids, pa.string()),
        pa.array([m.get(PROPERTY_TAGS) for m in maps], pa.string()),
        pa.array([m.get(PROPERTY_KEYS) for m in maps], pa.string()),
        _properties(maps),
        pa.array(bodies, pa.binary()),
        _timestamps(born),
        _timestamps(stored),
        pa.array(reconsume, pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


__all__ = ["ARROW_SCHEMA", "SCHEMA", "SCHEMA_DDL", "empty_batch", "record_batch"]
