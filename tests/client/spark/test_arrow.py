"""`record_batch`: pull bodies decoded column by column into the source's Arrow schema (no Spark, no
broker: the bodies are encoded here exactly as the store writes them)."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.spark.arrow import ARROW_SCHEMA, PulledBody, record_batch
from protocol.message import PROPERTY_KEYS, PROPERTY_TAGS, decode_message_batch, encode_stored_message

PORTS = st.integers(min_value=0, max_value=65_535)
HOSTS = st.one_of(st.builds(lambda ip, port: f"{ip}:{port}", st.ip_addresses(v=4), PORTS),
                  st.sampled_from(["[::1]:10911", "broker-a:10911", ""]))
EPOCH_MS = st.integers(min_value=0, max_value=2**43)          # to the year 2248
PROPERTY_NAMES = st.one_of(st.sampled_from([PROPERTY_TAGS, PROPERTY_KEYS, "UNIQ_KEY", "n"]), st.text(max_size=6))


def stored(**overrides: Any) -> dict[str, Any]:
    """`encode_stored_message` arguments of a plain message, with `overrides`."""
    kwargs: dict[str, Any] = {
        "topic": "t", "queue_id": 1, "queue_offset": 0, "commit_log_offset": 100, "flag": 0, "sys_flag": 0,
        "born_timestamp": 1_700_000_000_000, "born_host": "127.0.0.1:5000", "store_timestamp": 1_700_000_000_001,
        "store_host": "127.0.0.1:10911", "reconsume_times": 0, "properties": {PROPERTY_TAGS: "a", "u": "1"},
        "body": b"x"}
    return kwargs | overrides


@st.composite
def stored_messages(draw: st.DrawFn, queue_offset: int) -> dict[str, Any]:
    """The keyword arguments of `encode_stored_message` for the message at `queue_offset`."""
    return {
        "topic": draw(st.text(max_size=12)), "queue_id": draw(st.integers(0, 2**31 - 1)),
        "queue_offset": queue_offset, "commit_log_offset": draw(st.integers(0, 2**64 - 1)),
        "flag": draw(st.integers(-(2**31), 2**31 - 1)), "sys_flag": 0, "born_timestamp": draw(EPOCH_MS),
        "born_host": draw(HOSTS), "store_timestamp": draw(EPOCH_MS), "store_host": draw(HOSTS),
        "reconsume_times": draw(st.integers(0, 16)),
        "properties": draw(st.dictionaries(PROPERTY_NAMES, st.text(max_size=8), max_size=4)),
        "body": draw(st.binary(max_size=40)),
    }


@st.composite
def pulls(draw: st.DrawFn) -> list[tuple[int, list[dict[str, Any]]]]:
    """Consecutive pulls from a random offset: (first offset, its messages) with 0-5 messages each."""
    pulled, queue_offset = [], draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 5))):
        count = draw(st.integers(0, 5))
        pulled.append((queue_offset, [draw(stored_messages(queue_offset + i)) for i in range(count)]))
        queue_offset += count
    return pulled


def _body(messages: list[dict[str, Any]]) -> bytes:
    return b"".join(encode_stored_message(**m) for m in messages)


def _expected_rows(body: bytes, broker_name: str = "") -> list[dict[str, Any]]:
    """What the schema says a message becomes, from the protocol's own decoder."""
    rows = []
    for m in decode_message_batch(body):
        others = {k: v for k, v in m.properties.items() if k not in (PROPERTY_TAGS, PROPERTY_KEYS)}
        rows.append({"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset, "msg_id": m.msg_id,
                     "tags": m.tags, "keys": m.keys, "properties": sorted(others.items()), "body": m.body,
                     "born_timestamp": m.born_timestamp * 1000, "store_timestamp": m.store_timestamp * 1000,
                     "reconsume_times": m.reconsume_times, "broker_name": broker_name})
    return rows


def _rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The batch as dicts, timestamps as epoch microseconds and property maps sorted."""
    columns = {name: batch.column(name) for name in batch.schema.names}
    for name in ("born_timestamp", "store_timestamp"):
        columns[name] = columns[name].cast(pa.int64())
    rows: list[dict[str, Any]] = pa.RecordBatch.from_pydict(columns).to_pylist()
    for row in rows:
        row["properties"] = sorted(row["properties"])
    return rows


@settings(max_examples=200, deadline=None)
@given(pulls())
def test_batch_holds_every_message_as_the_protocol_decoder_reads_it(
        pulled: list[tuple[int, list[dict[str, Any]]]]) -> None:
    bodies = [PulledBody(_body(messages), low, low + len(messages)) for low, messages in pulled]
    batch = record_batch(bodies, None, {}, "broker-b")
    assert batch.schema.equals(ARROW_SCHEMA)
    assert _rows(batch) == [row for pulled_body in bodies for row in _expected_rows(pulled_body.body, "broker-b")]


def test_messages_outside_their_pulls_range_are_dropped() -> None:
    messages = [stored(queue_offset=q) for q in (3, 4, 5, 9)]
    batch = record_batch([PulledBody(_body(messages[:3]), 4, 6), PulledBody(_body(messages[3:]), 6, 9)], None, {})
    assert batch.column("queue_offset").to_pylist() == [4, 5]


def test_tag_filter_keeps_only_the_named_tags() -> None:
    messages = [stored(queue_offset=q, properties=props) for q, props in
                enumerate([{PROPERTY_TAGS: "a"}, {PROPERTY_TAGS: "b"}, {}, {PROPERTY_TAGS: "c", "x": "y"}])]
    batch = record_batch([PulledBody(_body(messages), 0, 4)], frozenset({"a", "c"}), {})
    assert batch.column("queue_offset").to_pylist() == [0, 3]
    assert batch.column("properties").to_pylist() == [[], [("x", "y")]]


def test_message_ids_of_several_store_hosts() -> None:
    hosts = ["10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.1:10911"]
    messages = [stored(queue_offset=i, store_host=h, commit_log_offset=(i + 1) * 2**40) for i, h in enumerate(hosts)]
    prefixes: dict[str, bytes] = {}
    batch = record_batch([PulledBody(_body(messages), 0, 3)], None, prefixes)
    assert batch.column("msg_id").to_pylist() == [
        "0A00000100002A9F0000010000000000", "0A00000200002A9F0000020000000000", "0A00000100002A9F0000030000000000"]
    assert set(prefixes) == {"10.0.0.1:10911", "10.0.0.2:10911"}


def test_no_messages_is_an_empty_batch() -> None:
    batch = record_batch([PulledBody(b"", 0, 1)], None, {})
    assert batch.num_rows == 0 and batch.schema.equals(ARROW_SCHEMA)


@pytest.mark.parametrize("body", [
    msgpack.packb([1, 2, 3]),                                    # an array, but not of 13 fields
    msgpack.packb("not an array"),
    msgpack.packb(list(range(13))),                              # 13 fields of the wrong types
    encode_stored_message(**stored())[:-3],   # cut inside a message
    b"\xc1",                                                     # never valid msgpack
])
def test_malformed_bodies_raise_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        record_batch([PulledBody(body, 0, 10)], None, {})


def test_random_bytes_decode_or_raise_value_error() -> None:
    good = _body([stored(queue_offset=i) for i in range(4)])
    for rng in map(random.Random, range(300)):
        noisy = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            noisy[rng.randrange(len(noisy))] = rng.randrange(256)
        with contextlib.suppress(ValueError):
            record_batch([PulledBody(bytes(noisy), 0, 4)], None, {})
