"""Records read back from the commit log by reput (a slave dispatching what it copied, a restart
rebuilding consume queues): `read_stored` (C) against its twin `read_stored_py`, and a store that
dispatches usual, unusual and undecodable records copied from a master."""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.message_store import MessageStore
from broker.store.record import encode_record, read_stored_py
from broker.store.reput import DISK_SLICE_RECORDS
from protocol import native
from protocol.subscription import tags_code
from tests.broker.store.conftest import TagFilter, bodies, eventually

native_records: Any = native.load("broker.store._records")

TEXT = st.text(max_size=8)
INT = st.integers(-(2**63), 2**64 - 1)
USUAL = st.fixed_dictionaries({"topic": TEXT, "queue_id": INT, "queue_offset": INT, "store_timestamp": INT,
                               "properties": st.dictionaries(TEXT, TEXT, max_size=3), "body": st.binary(max_size=80)})
ODD = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), TEXT, INT, st.binary(max_size=4),
                st.lists(INT, max_size=2), st.dictionaries(TEXT, INT, max_size=2))


def stored(fields: dict[str, Any], odd: tuple[int, Any] | None = None) -> bytes:
    values: list[Any] = [fields["topic"], fields["queue_id"], fields["queue_offset"], 7, 0, 0, 1, "h:1",
                         fields["store_timestamp"], "s:2", 0, fields["properties"], fields["body"]]
    if odd is not None:
        values[odd[0]] = odd[1]
    return encode_record(msgpack.packb(values, use_bin_type=True))


@given(st.lists(st.tuples(USUAL, st.none() | st.tuples(st.integers(0, 12), ODD)), max_size=6),
       st.integers(0, 3), st.integers(0, 8), st.data())
def test_read_stored_gives_the_usual_records_up_to_the_first_other(records: list[Any], tail: int, max_count: int,
                                                                   data: st.DataObject) -> None:
    encoded = [stored(fields, odd) for fields, odd in records]
    buffer = bytearray(b"".join(encoded) + bytes(tail))
    limit = data.draw(st.integers(0, len(buffer)), label="limit")
    got = read_stored_py(buffer, 0, limit, 1_000, max_count)
    position, wanted = 0, list[tuple[Any, ...]]()
    for record in encoded:
        if len(wanted) == max_count or position + len(record) > limit:
            break
        values = msgpack.unpackb(record[8:], raw=False, strict_map_key=False)
        usual = (all(type(values[i]) is int for i in (1, 2, 3, 4, 5, 6, 8, 10))
                 and all(type(values[i]) is str for i in (0, 7, 9)) and type(values[12]) is bytes
                 and type(values[11]) is dict and all(type(k) is str and type(v) is str for k, v in values[11].items()))
        if not usual:
            break
        wanted.append((1_000 + position, len(record), values[0], values[1], values[2], values[8], values[11]))
        position += len(record)
    assert got == wanted
    if native_records is not None:
        assert native_records.read_stored(buffer, 0, limit, 1_000, max_count, zlib.crc32) == got


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
@pytest.mark.parametrize("change", ["crc", "size", "array16", "str body", "trailing byte", "relative"])
def test_c_stops_where_python_does(change: str) -> None:
    fields = {"topic": "t", "queue_id": 0, "queue_offset": 0, "store_timestamp": 1, "properties": {}, "body": b"b"}
    first, second = bytearray(stored(fields)), bytearray(stored(fields))
    if change == "crc":
        second[5] ^= 1
    elif change == "size":
        second[3] = 200
    elif change == "array16":           # the same 13 fields under an array16 header: valid msgpack
        payload = b"\xdc\x00\x0d" + bytes(second[9:])
        second = bytearray(encode_record(payload))
    elif change == "str body":
        payload = msgpack.packb(["t", 0, 0, 7, 0, 0, 1, "h:1", 1, "s:2", 0, {}, "b"], use_bin_type=True)
        second = bytearray(encode_record(payload))
    elif change == "trailing byte":
        second = bytearray(encode_record(bytes(second[8:]) + b"\x00"))
    buffer = first + second
    relative = 1 if change == "relative" else 0
    python = read_stored_py(buffer, relative, len(buffer), 0, 10)
    assert native_records.read_stored(buffer, relative, len(buffer), 0, 10, zlib.crc32) == python
    assert len(python) == (0 if change == "relative" else 1)


async def test_a_slave_store_dispatches_usual_unusual_and_undecodable_records(
        store: MessageStore, caplog: pytest.LogCaptureFixture) -> None:
    """Copied records are read back: the usual ones in C, one with a property of another type by
    Python (dispatched), one that is no stored message and one whose tag is no str (both skipped,
    logged); the queue and its tag codes are as if all had been sent."""
    def usual(queue_offset: int, tag: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"topic": "t", "queue_id": 0, "queue_offset": queue_offset, "store_timestamp": 5,
                "properties": {"TAGS": tag, **(extra or {})}, "body": b"m%d" % queue_offset}
    records = [stored(usual(0, "A")), stored(usual(1, "B")), stored(usual(2, "A"), (11, {"TAGS": "A", "n": 1})),
               encode_record(b"\x01"), stored(usual(3, "B"), (11, {"TAGS": 5})), stored(usual(3, "B")),
               stored(usual(4, "A"))]
    with caplog.at_level(logging.ERROR, logger="broker.store.reput"):
        store.append_replicated(0, b"".join(records))
        await eventually(lambda: store.get_max_offset("t", 0) == 5)
    assert store.get_message("t", 0, 0, 32, None).message_count == 5
    assert bodies(store.get_message("t", 0, 0, 2, None)) == [b"m0", b"m1"]
    assert bodies(store.get_message("t", 0, 3, 32, None)) == [b"m3", b"m4"]     # (m2: no client decodes it)
    assert bodies(store.get_message("t", 0, 0, 32, TagFilter({tags_code("B")}))) == [b"m1", b"m3"]
    skipped = [r.getMessage() for r in caplog.records if "skipping undecodable record" in r.getMessage()]
    assert len(skipped) == 2, skipped


async def test_reput_reads_a_large_transfer_back_in_slices_letting_the_loop_run(store: MessageStore) -> None:
    """A slave's transfer of 600 records is dispatched 256 at a time, with the event loop running
    between slices (a callback queued behind reput's wake-up runs after the first slice, not after
    all 600): the slave's fsync completion and acknowledgement no longer wait for the whole
    transfer's dispatch."""
    records = [stored({"topic": "t", "queue_id": 0, "queue_offset": i, "store_timestamp": 5 + i // 100,
                       "properties": {"TAGS": "A", "UNIQ_KEY": f"k{i}"}, "body": b"m%d" % i}) for i in range(600)]
    seen: list[int] = []
    store.append_replicated(0, b"".join(records))
    asyncio.get_running_loop().call_soon(lambda: seen.append(store.get_max_offset("t", 0)))
    await eventually(lambda: store.get_max_offset("t", 0) == 600)
    assert seen == [DISK_SLICE_RECORDS]
    assert bodies(store.get_message("t", 0, 590, 32, None)) == [b"m%d" % i for i in range(590, 600)]
