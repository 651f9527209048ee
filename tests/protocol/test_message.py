"""Stored messages in a body, and offset message ids."""

from __future__ import annotations

import contextlib
import ipaddress
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError
from protocol.message import (
    Message,
    MessageExt,
    decode_message_batch,
    encode_batch_body,
    encode_stored_message,
    make_msg_id,
    message_from_fields,
    msg_id_commit_log_offset,
    parse_msg_id,
)
from tests.protocol.strategies import chunk

I32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
OFFSETS = st.integers(min_value=0, max_value=2**63 - 1)
PORTS = st.integers(min_value=0, max_value=65_535)
HOSTS = st.builds(lambda ip, port: f"{ip}:{port}", st.ip_addresses(v=4), PORTS)


@st.composite
def stored_messages(draw: st.DrawFn) -> dict[str, Any]:
    """The keyword arguments of `encode_stored_message`."""
    return {
        "topic": draw(st.text(max_size=20)), "queue_id": draw(st.integers(0, 2**31 - 1)),
        "queue_offset": draw(OFFSETS), "commit_log_offset": draw(OFFSETS), "flag": draw(I32),
        "sys_flag": draw(I32), "born_timestamp": draw(OFFSETS), "born_host": draw(HOSTS),
        "store_timestamp": draw(OFFSETS), "store_host": draw(HOSTS), "reconsume_times": draw(I32),
        "properties": draw(st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4)),
        "body": draw(st.binary(max_size=100)),
    }


def assert_message(got: MessageExt, sent: dict[str, Any]) -> None:
    for name, value in sent.items():
        assert getattr(got, name) == value, name
    assert got.msg_id == make_msg_id(sent["store_host"], sent["commit_log_offset"])


@settings(max_examples=200, deadline=None)
@given(st.lists(stored_messages(), max_size=6), st.booleans())
def test_stored_messages_round_trip_back_to_back(sent: list[dict[str, Any]], as_view: bool) -> None:
    body = b"".join(encode_stored_message(**m) for m in sent)
    decoded = decode_message_batch(memoryview(body) if as_view else body)
    assert len(decoded) == len(sent)
    for got, m in zip(decoded, sent, strict=True):
        assert_message(got, m)


def test_stored_array_layout() -> None:
    raw = encode_stored_message(
        topic="t", queue_id=1, queue_offset=2, commit_log_offset=3, flag=4, sys_flag=0, born_timestamp=5,
        born_host="10.0.0.2:50000", store_timestamp=6, store_host="10.0.0.1:10911", reconsume_times=7,
        properties={"TAGS": "a"}, body=b"hi")
    assert msgpack.unpackb(raw, raw=False) == [
        "t", 1, 2, 3, 4, 0, 5, "10.0.0.2:50000", 6, "10.0.0.1:10911", 7, {"TAGS": "a"}, b"hi"]
    (msg,) = decode_message_batch(raw)
    assert (msg.tags, msg.keys, msg.uniq_key, msg.delay_level) == ("a", None, None, 0)


def test_empty_body_is_no_messages() -> None:
    assert decode_message_batch(b"") == []


def test_message_wire_properties() -> None:
    msg = Message(topic="t", body=b"x", tags="TagA", keys=["k1", "k2"], properties={"p": "v"}, delay_level=3)
    assert msg.wire_properties() == {"p": "v", "TAGS": "TagA", "KEYS": "k1 k2", "DELAY": "3"}
    assert Message(topic="t", body=b"", keys="one").wire_properties() == {"KEYS": "one"}
    batch = msgpack.unpackb(encode_batch_body([msg, Message(topic="t", body=b"y", flag=2)]), raw=False)
    assert batch == [[msg.wire_properties(), 0, b"x"], [{}, 2, b"y"]]


_GOOD = encode_stored_message(
    topic="t", queue_id=0, queue_offset=0, commit_log_offset=0, flag=0, sys_flag=0, born_timestamp=0,
    born_host="1.2.3.4:5", store_timestamp=0, store_host="1.2.3.4:5", reconsume_times=0, properties={},
    body=b"abc")
_FIELDS: list[Any] = msgpack.unpackb(_GOOD, raw=False)


def _with(index: int, value: Any) -> bytes:
    values = list(_FIELDS)
    values[index] = value
    return msgpack.packb(values, use_bin_type=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize("body", [
    _GOOD[:-1], _GOOD + _GOOD[:5], b"\xc1", msgpack.packb([1, 2, 3]), msgpack.packb({"topic": "t"}),
    b"\x91\x81\x91\x01\x02",                                  # [{[1]: 2}]: an array as a map key
    _with(0, 5), _with(3, "0"), _with(3, -1), _with(3, 1.5), _with(1, True), _with(9, 5),
    _with(9, "1.2.3.4:port"), _with(11, {"TAGS": 1}), _with(12, "not bin"),
])
def test_malformed_message_body_raises_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_message_batch(body)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=3))
def test_random_message_bodies_decode_or_raise_protocol_error(noise: bytes, cuts: list[int]) -> None:
    for body in [noise, _GOOD + noise, *chunk(_GOOD + noise, cuts)]:
        with contextlib.suppress(ProtocolError):
            decode_message_batch(body)


def test_message_from_fields_rejects_wrong_shapes() -> None:
    assert message_from_fields(_FIELDS).body == b"abc"
    for bad in [None, _FIELDS[:-1], [*_FIELDS, 1], "x" * 13]:
        with pytest.raises(ProtocolError):
            message_from_fields(bad)


# -- message ids ------------------------------------------------------------------------------

def test_msg_id_layout() -> None:
    msg_id = make_msg_id("10.0.0.1:10911", 0x0102030405060708)
    assert msg_id == "0A000001" "00002A9F" "0102030405060708"
    assert parse_msg_id(msg_id) == ("10.0.0.1:10911", 0x0102030405060708)


@settings(max_examples=200, deadline=None)
@given(st.ip_addresses(v=4), st.integers(0, 2**32 - 1), OFFSETS)
def test_msg_id_round_trips(ip: ipaddress.IPv4Address, port: int, offset: int) -> None:
    msg_id = make_msg_id(f"{ip}:{port}", offset)
    assert len(msg_id) == 32 and msg_id == msg_id.upper()
    assert int(msg_id, 16) == (int(ip) << 96) | (port << 64) | offset
    assert parse_msg_id(msg_id) == (f"{ip}:{port}", offset)
    assert parse_msg_id(msg_id.lower()) == (f"{ip}:{port}", offset)
    assert msg_id_commit_log_offset(msg_id) == msg_id_commit_log_offset(msg_id.lower()) == offset


def test_msg_id_of_a_host_that_is_not_ipv4_uses_zero_address() -> None:
    assert make_msg_id("broker.example:10911", 5).startswith("00000000" "00002A9F")
    assert make_msg_id("[::1]:10911", 5)[:8] == "00000000"


@pytest.mark.parametrize("msg_id", [
    "", "0A000001", "0A00000100002A9F010203040506070", "0A00000100002A9F01020304050607080",
    "0A00000100002A9F010203040506070G", "0x0000000000002A9F0102030405060708", " " * 32,
    "0A000001 0002A9F0102030405060708", "0A00000100002A9F010203040506070\n",
    "\u0660" * 32, "\uff10" * 32, "\u00e9" * 32,   # Arabic-Indic zero, fullwidth zero, e-acute
])
def test_malformed_msg_ids_raise_value_error(msg_id: str) -> None:
    with pytest.raises(ValueError):
        parse_msg_id(msg_id)
    with pytest.raises(ValueError):
        msg_id_commit_log_offset(msg_id)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_random_text_msg_id_parses_or_raises_value_error(msg_id: str) -> None:
    try:
        host, offset = parse_msg_id(msg_id)
    except ValueError:
        with pytest.raises(ValueError):
            msg_id_commit_log_offset(msg_id)
        return
    assert make_msg_id(host, offset) == msg_id.upper()
    assert msg_id_commit_log_offset(msg_id) == offset
