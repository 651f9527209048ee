"""Record codec: round trip, damage detection, and the partial decode of the offset field."""

from __future__ import annotations

import contextlib
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.record import (
    HEADER_BYTES,
    RecordError,
    RunHead,
    RunMessage,
    decode_record,
    decode_stored_fields,
    encode_record,
    encode_run,
    encode_run_py,
    payload_commit_log_offset,
    payload_properties,
    record_size_at,
    write_record,
    write_record_py,
)
from protocol.message import encode_stored_message

stored_messages = st.builds(
    encode_stored_message,
    topic=st.from_regex(r"[a-zA-Z0-9_%|-]{1,40}", fullmatch=True),
    queue_id=st.integers(0, 1 << 16), queue_offset=st.integers(0, 1 << 62),
    commit_log_offset=st.integers(0, 1 << 62), flag=st.integers(-(1 << 31), (1 << 31) - 1),
    sys_flag=st.integers(0, 255), born_timestamp=st.integers(0, 1 << 50), born_host=st.text(max_size=30),
    store_timestamp=st.integers(0, 1 << 50), store_host=st.text(max_size=30),
    reconsume_times=st.integers(0, 100),
    properties=st.dictionaries(st.text(max_size=10), st.text(max_size=20)),
    body=st.binary(max_size=300))


@given(st.binary(min_size=1, max_size=2000), st.binary(max_size=20))
def test_records_round_trip_after_any_prefix(payload: bytes, prefix: bytes) -> None:
    data = prefix + encode_record(payload) + b"\0" * 8
    assert bytes(decode_record(data, len(prefix))) == payload
    assert record_size_at(data, len(prefix), len(data)) == len(payload) + HEADER_BYTES


@given(st.binary(min_size=1, max_size=500), st.data())
def test_any_single_byte_change_is_detected(payload: bytes, data: st.DataObject) -> None:
    record = bytearray(encode_record(payload))
    position = data.draw(st.integers(0, len(record) - 1))
    record[position] ^= data.draw(st.integers(1, 255))
    assert record_size_at(bytes(record), 0, len(record)) <= 0     # 0 only if the size became 0


@given(stored_messages)
def test_stored_payload_offset_field_is_read_without_a_full_decode(payload: bytes) -> None:
    fields = decode_stored_fields(payload)
    assert payload_commit_log_offset(payload) == fields[3]


def test_record_size_at_tells_zero_tail_from_damage() -> None:
    record = encode_record(b"\x90")
    assert record_size_at(record + bytes(16), len(record), len(record) + 16) == 0
    assert record_size_at(record, 0, len(record) - 1) == -1          # runs past the limit
    assert record_size_at(b"\0\0\0\x05\0\0\0\0\0", 0, 9) == -1         # smaller than a header + 1
    assert record_size_at(record, 0, 5) == 0                          # no room for a header


@pytest.mark.parametrize("payload", [b"\xc1", b"\x93\x01\x02\x03", b"not msgpack at all"])
def test_payloads_that_are_not_stored_messages_raise(payload: bytes) -> None:
    with pytest.raises(RecordError):
        decode_stored_fields(payload)
    with pytest.raises(RecordError):
        payload_commit_log_offset(payload)


def test_decode_record_raises_on_garbage() -> None:
    with pytest.raises(RecordError):
        decode_record(b"\0\0\0\x20garbage-garbage-garbage-garbage")



@pytest.mark.parametrize("body_bytes", [0, 100, 16 * 1024, 1 << 20])
def test_payload_properties_reads_the_properties_of_any_size(body_bytes: int) -> None:
    """Small payloads are unpacked whole; from 16 KiB on only the part before the body is read."""
    properties = {"TAGS": "a", "amount": "12", "long": "x" * 2_000}
    payload = encode_stored_message(
        topic="t", queue_id=0, queue_offset=0, commit_log_offset=0, flag=0, sys_flag=0, born_timestamp=0,
        born_host="127.0.0.1:1", store_timestamp=0, store_host="127.0.0.1:2", reconsume_times=0,
        properties=properties, body=b"b" * body_bytes)
    assert payload_properties(payload) == properties
    assert payload_properties(memoryview(payload)) == properties


@pytest.mark.parametrize("garbage", [b"", b"\xc1", b"\x93\x01\x02\x03", bytes([0x9D]) + bytes(13),
                                     b"\xdc\x00\x0d" + bytes(40_000), b"\xdc\x00\x0d" + b"\xc1" * 40_000])
def test_payload_properties_of_garbage_is_none(garbage: bytes) -> None:
    assert payload_properties(garbage) is None


# -- runs of records (a batch's put) --------------------------------------------------------------

native_records: Any = None
try:
    from broker.store import _records  # type: ignore[attr-defined]
    native_records = _records
except ImportError:
    pass

TEXT = st.text(max_size=12)
INT64 = st.integers(-(2**63), 2**63 - 1)
run_heads = st.tuples(TEXT, INT64, INT64, INT64, TEXT, INT64, TEXT, INT64)
run_messages = st.lists(st.tuples(st.dictionaries(TEXT, TEXT, max_size=3), INT64, st.binary(max_size=300)),
                        min_size=1, max_size=12)


@given(run_heads, run_messages, st.integers(0, 2**62), st.integers(0, 2**40), st.integers(0, 4000), st.data())
def test_a_run_is_the_records_of_encode_stored_message(head: RunHead, messages: list[RunMessage],
                                                        first_queue_offset: int, position: int, room: int,
                                                        data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(messages)), label="start")
    encoded, offsets, sizes = encode_run(head, messages, start, first_queue_offset, position, position + room)
    topic, queue_id, sys_flag, born_timestamp, born_host, store_timestamp, store_host, reconsume_times = head
    expected = b""
    for index in range(start, len(messages)):
        properties, flag, body = messages[index]
        record = encode_record(encode_stored_message(
            topic=topic, queue_id=queue_id, queue_offset=first_queue_offset + index,
            commit_log_offset=position + len(expected), flag=flag, sys_flag=sys_flag,
            born_timestamp=born_timestamp, born_host=born_host, store_timestamp=store_timestamp,
            store_host=store_host, reconsume_times=reconsume_times, properties=properties, body=body))
        if len(expected) + len(record) > room:
            break
        expected += record
    assert encoded == expected
    assert sum(sizes) == len(encoded) and offsets == [position + sum(sizes[:i]) for i in range(len(sizes))]
    assert (encoded, offsets, sizes) == encode_run_py(head, messages, start, first_queue_offset, position,
                                                      position + room)


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
@pytest.mark.parametrize(("head", "messages"), [
    (("t", 0, 0, 0, "h", 0, "s", 0), [({"k": 1}, 0, b"x")]),           # a property that is not str
    (("t", 0, 0, 0, "h", 0, "s", 0), [({}, 0, bytearray(b"x"))]),      # a bytearray body
    (("t", 0, 0, 0, "h", 0, "s", 0), [({}, True, b"x")]),               # a bool flag
    (("t", 2**64, 0, 0, "h", 0, "s", 0), [({}, 0, b"x")]),              # out of msgpack's ints
    (("\ud800", 0, 0, 0, "h", 0, "s", 0), [({}, 0, b"x")]),             # not UTF-8 encodable
    (("t", 0, 0, 0, "h", 0, "s", 0), [[{}, 0, b"x", 1]]),               # not (properties, flag, body)
])
def test_c_leaves_unusual_runs_to_python(head: Any, messages: Any) -> None:
    assert native_records.encode_run(head, messages, 0, 0, 0, 1 << 20, zlib.crc32) is None
    with contextlib.suppress(Exception):        # the twin encodes it, or raises msgpack's error
        encode_run(head, messages, 0, 0, 0, 1 << 20)


@pytest.mark.skipif(native_records is None or not native_records.c_crc32,
                    reason="broker.store._records was not built, or found no libz.so.1 (it calls zlib.crc32)")
def test_c_takes_each_records_crc_from_zlib_itself() -> None:
    def no_python_crc(data: Any) -> int:
        raise AssertionError("the C encoder called the Python crc32")
    head: RunHead = ("t", 1, 0, 2, "h", 3, "s", 0)
    messages: list[RunMessage] = [({"UNIQ_KEY": f"u{i}"}, 0, bytes([i]) * 100 * i) for i in range(5)]
    assert native_records.encode_run(head, messages, 0, 9, 1_000, 1 << 20, no_python_crc) == encode_run_py(
        head, messages, 0, 9, 1_000, 1 << 20)


@pytest.mark.parametrize(("property_count", "body_bytes"), [(15, 255), (16, 256), (40, 65_535), (3, 65_536)])
def test_runs_use_msgpack_s_larger_map_and_bin_forms(property_count: int, body_bytes: int) -> None:
    head: RunHead = ("t" * 40, 7, 0, 1, "h" * 300, 2, "s", 0)
    properties = {f"k{i}": "v" * i for i in range(property_count)}
    messages: list[RunMessage] = [(properties, -5, bytes(body_bytes))]
    encoded, _, _ = encode_run(head, messages, 0, 9, 100, 1 << 20)
    assert encoded == encode_record(encode_stored_message(
        topic="t" * 40, queue_id=7, queue_offset=9, commit_log_offset=100, flag=-5, sys_flag=0, born_timestamp=1,
        born_host="h" * 300, store_timestamp=2, store_host="s", reconsume_times=0, properties=properties,
        body=bytes(body_bytes)))


# -- one record written into a file's map (the one-message send path) ------------------------------

@given(run_heads, run_messages, st.integers(0, 2**62), st.integers(0, 2**40), st.integers(0, 600),
       st.integers(0, 4000))
def test_a_written_record_is_the_run_of_that_one_message(head: RunHead, messages: list[RunMessage],
                                                          queue_offset: int, position: int, relative: int,
                                                          room: int) -> None:
    """`write_record` (C when built) writes exactly `encode_run`'s record at `relative`, touching
    no other byte, or nothing and 0 when it would end past `limit`; its twin does the same."""
    message = messages[0]
    limit = relative + room
    expected, offsets, _ = encode_run_py(head, [message], 0, queue_offset, position, position + room)
    for writer in (write_record, write_record_py):
        buffer = bytearray(b"\xee" * (limit + 16))
        total = writer(buffer, relative, limit, head, queue_offset, position, message)
        if offsets:
            assert total == len(expected)
            assert buffer == b"\xee" * relative + expected + b"\xee" * (limit + 16 - relative - total)
        else:
            assert total == 0 and buffer == b"\xee" * (limit + 16)


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
@pytest.mark.parametrize(("head", "message", "relative", "limit"), [
    (("t", 0, 0, 0, "h", 0, "s", 0), ({"k": 1}, 0, b"x"), 0, 100),             # a property that is not str
    (("t", 0, 0, 0, "h", 0, "s", 0), ({}, True, b"x"), 0, 100),                # a bool flag
    (("t", 2**64, 0, 0, "h", 0, "s", 0), ({}, 0, b"x"), 0, 100),               # out of msgpack's ints
    (("\ud800", 0, 0, 0, "h", 0, "s", 0), ({}, 0, b"x"), 0, 100),              # not UTF-8 encodable
    (("t", 0, 0, 0, "h", 0, "s"), ({}, 0, b"x"), 0, 100),                      # a short head
    (("t", 0, 0, 0, "h", 0, "s", 0), ({}, 0, b"x"), -1, 100),                  # before the buffer
    (("t", 0, 0, 0, "h", 0, "s", 0), ({}, 0, b"x"), 50, 40),                   # relative past limit
    (("t", 0, 0, 0, "h", 0, "s", 0), ({}, 0, b"x"), 0, 201),                   # limit past the buffer
])
def test_c_leaves_unusual_records_to_python_and_writes_nothing(head: Any, message: Any, relative: int,
                                                                limit: int) -> None:
    buffer = bytearray(200)
    assert native_records.write_record(buffer, relative, limit, head, 0, 0, message, zlib.crc32) is None
    assert buffer == bytearray(200)


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
def test_c_writes_a_record_larger_than_its_stack_buffer() -> None:
    head: RunHead = ("t", 1, 0, 2, "h" * 2000, 3, "s", 0)
    message: RunMessage = ({f"k{i}": "v" * 300 for i in range(20)}, 0, bytes(70_000))
    by_c, by_python = bytearray(100_000), bytearray(100_000)
    total = native_records.write_record(by_c, 10, 100_000, head, 4, 5, message, zlib.crc32)
    assert total == write_record_py(by_python, 10, 100_000, head, 4, 5, message) > 70_000
    assert by_c == by_python
