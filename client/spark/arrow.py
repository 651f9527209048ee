"""The source's schema, and pull bodies made into Arrow batches column by column.

A pull body is a run of msgpack arrays, one per message (PROTOCOL.md "Messages in a body"):

    [topic, queue_id, queue_offset, commit_log_offset, flag, sys_flag,
     born_timestamp, born_host, store_timestamp, store_host, reconsume_times, properties, body]

`record_batch` turns the bodies of several pulls into one `pyarrow.RecordBatch` whose schema is
exactly `ARROW_SCHEMA` (Spark rejects a batch whose Arrow schema differs in any type, nullability or
field name). `tags` and `keys` are the TAGS and KEYS properties; `properties` holds every other
property (UNIQ_KEY included); `msg_id` is the broker's offset message id (store host + commit log
offset); `broker_name` names the broker of the queue (a queue is `(broker_name, queue_id)`); times
are epoch ms on the wire and UTC microsecond timestamps here.

This is the executor's hot loop (one call per ~8k rows), so no Python code runs per message: msgpack
decodes each body in C, `zip` transposes the arrays into columns, pyarrow converts each column in
one call, and the derived columns (message ids, TAGS / KEYS split off the property maps, the offset
range and tag checks) are numpy / Arrow kernels over whole columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
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

from protocol.message import PROPERTY_KEYS, PROPERTY_TAGS, STORED_FIELD_COUNT, msg_id_prefix

SCHEMA_DDL = ("topic string, queue_id int, queue_offset long, msg_id string, tags string, keys string, "
              "properties map<string,string>, body binary, born_timestamp timestamp, "
              "store_timestamp timestamp, reconsume_times int, broker_name string")
SCHEMA = StructType([
    StructField("topic", StringType()), StructField("queue_id", IntegerType()),
    StructField("queue_offset", LongType()), StructField("msg_id", StringType()),
    StructField("tags", StringType()), StructField("keys", StringType()),
    StructField("properties", MapType(StringType(), StringType())), StructField("body", BinaryType()),
    StructField("born_timestamp", TimestampType()), StructField("store_timestamp", TimestampType()),
    StructField("reconsume_times", IntegerType()), StructField("broker_name", StringType()),
])   # SCHEMA_DDL, built without a SparkSession (parsing DDL needs one)
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")   # what Spark's Python worker expects
_PROPERTIES_TYPE = ARROW_SCHEMA.field("properties").type
_TIMESTAMP_TYPE = ARROW_SCHEMA.field("born_timestamp").type
_NIL = msgpack.packb(None)
_MSG_ID_DIGITS = 32                                       # 16 of store host, 16 of commit log offset
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_NIBBLE_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)   # the 16 hex digits of a u64, most significant first

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PulledBody:
    """The body of a FOUND pull that covered queue offsets [low, high) (from the offset asked to
    the next begin offset the broker answered); a message outside that range is dropped (a broker
    sends none)."""

    body: bytes
    low: int
    high: int


def _decode(bodies: Sequence[PulledBody]) -> tuple[list[tuple[Any, ...]], list[int]]:
    """Every stored-message array of `bodies`, as tuples, and how many each body held; raises
    `ValueError` on a body that is not whole msgpack values."""
    messages: list[tuple[Any, ...]] = []
    counts = []
    try:
        for pulled in bodies:
            unpacker = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=False,
                                        max_buffer_size=len(pulled.body) + 1)
            unpacker.feed(pulled.body)
            before = len(messages)
            messages.extend(unpacker)
            # tell() is unreliable once the unpacker stops inside a value; a nil fed after the body
            # comes back on its own only when no cut value is pending.
            unpacker.feed(_NIL)
            if list(unpacker) != [None]:
                raise ValueError("a pull body ends inside a message")
            counts.append(len(messages) - before)
    except (msgpack.UnpackException, TypeError) as exc:    # TypeError: an unhashable map key
        raise ValueError(f"a pull body is not msgpack: {exc}") from exc
    return messages, counts


def _columns(messages: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The messages transposed into the 13 stored fields; `ValueError` unless every one is an
    array of 13."""
    if set(map(type, messages)) != {tuple}:
        raise ValueError("a pull body holds something that is not a stored message")
    try:
        columns = list(zip(*messages, strict=True))
    except ValueError:
        raise ValueError("a pull body holds a stored message of the wrong length") from None
    if len(columns) != STORED_FIELD_COUNT:
        raise ValueError("a pull body holds a stored message of the wrong length")
    return columns


def _timestamps(epoch_ms: tuple[int, ...]) -> pa.Array:
    return pc.multiply_checked(pa.array(epoch_ms, pa.int64()), 1_000).cast(_TIMESTAMP_TYPE)


def _msg_ids(store_hosts: tuple[str, ...], commit_log_offsets: pa.Array, prefixes: dict[str, bytes]) -> pa.Array:
    """32 upper-case hex digits per row (`protocol.message.make_msg_id`), written into one
    fixed-stride buffer; `prefixes` caches each store host's 16 digits across calls."""
    hosts = set(store_hosts)
    for host in hosts - prefixes.keys():
        prefixes[host] = msg_id_prefix(host).encode("ascii")
    count = len(store_hosts)
    digits = np.empty((count, _MSG_ID_DIGITS), dtype=np.uint8)
    if len(hosts) == 1:
        digits[:, :16] = np.frombuffer(prefixes[store_hosts[0]], dtype=np.uint8)
    else:
        host_prefixes = np.frombuffer(b"".join(prefixes[h] for h in store_hosts), dtype=np.uint8)
        digits[:, :16] = host_prefixes.reshape(count, 16)
    offsets = commit_log_offsets.to_numpy().astype(np.uint64)
    digits[:, 16:] = _HEX[(offsets[:, None] >> _NIBBLE_SHIFTS) & np.uint64(0xF)]
    value_offsets = np.arange(0, (count + 1) * _MSG_ID_DIGITS, _MSG_ID_DIGITS, dtype=np.int32)
    return pa.StringArray.from_buffers(count, pa.py_buffer(value_offsets), pa.py_buffer(digits))


def _pick(values: pa.Array, rows: IntArray, where: BoolArray, count: int) -> pa.Array:
    """A column of `count` rows: row r holds the entry of `values` that `where` marks on row r (at
    most one per row: map keys are unique), null where none is marked."""
    index = np.full(count, -1, dtype=np.int64)
    index[rows[where]] = np.flatnonzero(where)
    return values.take(pa.array(index, mask=index < 0))


def _properties(maps: tuple[dict[str, str], ...]) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(properties without TAGS and KEYS, tags, keys) of the messages' property maps."""
    count = len(maps)
    full = pa.array(maps, type=_PROPERTIES_TYPE)
    keys, values = full.keys, full.items
    is_tags = pc.equal(keys, PROPERTY_TAGS).to_numpy(zero_copy_only=False)
    is_keys = pc.equal(keys, PROPERTY_KEYS).to_numpy(zero_copy_only=False)
    own = is_tags | is_keys
    if not own.any():
        nulls = pa.nulls(count, pa.string())
        return full, nulls, nulls
    map_offsets = full.offsets.to_numpy()
    rows = np.repeat(np.arange(count, dtype=np.int64), np.diff(map_offsets))
    kept = ~own
    kept_offsets = np.concatenate(([0], np.cumsum(kept, dtype=np.int32)))[map_offsets]
    properties = pa.MapArray.from_arrays(pa.array(kept_offsets, pa.int32()), keys.filter(kept),
                                         values.filter(kept), type=_PROPERTIES_TYPE)
    return properties, _pick(values, rows, is_tags, count), _pick(values, rows, is_keys, count)


def _keep(queue_offsets: pa.Array, bodies: Sequence[PulledBody], counts: list[int],
          tags_column: pa.Array, tags: frozenset[str] | None) -> pa.Array | None:
    """The rows to keep (each message inside its pull's [low, high) and, with a tag filter, tagged
    with one of `tags`), or None when that is every row."""
    qo = queue_offsets.to_numpy()
    lows = np.repeat(np.fromiter((b.low for b in bodies), np.int64, len(bodies)), counts)
    highs = np.repeat(np.fromiter((b.high for b in bodies), np.int64, len(bodies)), counts)
    keep = (qo >= lows) & (qo < highs)
    if tags is not None:
        keep &= pc.is_in(tags_column, value_set=pa.array(sorted(tags), pa.string())).to_numpy(zero_copy_only=False)
    return None if keep.all() else pa.array(keep)


def record_batch(bodies: Sequence[PulledBody], tags: frozenset[str] | None,
                 prefixes: dict[str, bytes], broker_name: str = "") -> pa.RecordBatch:
    """One batch of `ARROW_SCHEMA` holding the messages of `bodies` in order, less those outside their
    pull's offset range and, when `tags` is set, those whose TAGS is not one of them (brokers filter
    on tags codes, which collide); every row's `broker_name` is `broker_name`. `prefixes` caches
    message id prefixes across calls. Raises `ValueError` on a malformed body (not msgpack, not
    stored-message arrays, mistyped fields)."""
    messages, counts = _decode(bodies)
    if not messages:
        return empty_batch()
    try:
        return _build(messages, bodies, counts, tags, prefixes, broker_name)
    except (pa.ArrowException, TypeError, OverflowError) as exc:
        raise ValueError(f"a pull body holds a mistyped stored message: {exc}") from exc


def _build(messages: list[tuple[Any, ...]], bodies: Sequence[PulledBody], counts: list[int],
           tags: frozenset[str] | None, prefixes: dict[str, bytes], broker_name: str) -> pa.RecordBatch:
    (topics, queue_ids, queue_offsets, commit_log_offsets, _, _, born, _, stored, store_hosts, reconsume,
     maps, payloads) = _columns(messages)
    del messages
    offsets = pa.array(queue_offsets, pa.int64())
    properties, tags_column, keys_column = _properties(maps)
    batch = pa.RecordBatch.from_arrays([
        pa.array(topics, pa.string()),
        pa.array(queue_ids, pa.int32()),
        offsets,
        _msg_ids(store_hosts, pa.array(commit_log_offsets, pa.uint64()), prefixes),
        tags_column,
        keys_column,
        properties,
        pa.array(payloads, pa.binary()),
        _timestamps(born),
        _timestamps(stored),
        pa.array(reconsume, pa.int32()),
        pa.repeat(pa.scalar(broker_name, pa.string()), len(queue_offsets)),
    ], schema=ARROW_SCHEMA)
    keep = _keep(offsets, bodies, counts, tags_column, tags)
    return batch if keep is None else batch.filter(keep)


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


__all__ = ["ARROW_SCHEMA", "SCHEMA", "SCHEMA_DDL", "PulledBody", "empty_batch", "record_batch"]
