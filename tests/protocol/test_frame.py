"""Frames: round trips at any chunking, and every malformed input raises `FrameError` only."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codes import CommandFlag
from protocol.command import RemotingCommand, request
from protocol.errors import FrameError
from protocol.frame import FrameDecoder, encode_frame, encode_frame_bytes
from tests.protocol.strategies import BODIES, EXT_MAPS, MAP_KEYS, MSGPACK_INT, VALUES, chunk, commands

_ABSENT = object()
_HEADER_KEYS = ("code", "opaque", "flag", "version", "remark", "ext")
_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "code": MSGPACK_INT, "opaque": MSGPACK_INT, "flag": MSGPACK_INT, "version": MSGPACK_INT,
    "remark": st.none() | st.text(max_size=10), "ext": st.none() | EXT_MAPS,
}


def frame(header: bytes, body: bytes = b"", *, frame_length: int | None = None,
          header_length: int | None = None) -> bytes:
    """A frame with the given header bytes; the lengths are right unless overridden."""
    fl = 4 + len(header) + len(body) if frame_length is None else frame_length
    hl = len(header) if header_length is None else header_length
    return struct.pack(">II", fl, hl) + header + body


def packed(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def decode(pieces: list[bytes], max_frame_bytes: int = 1 << 20) -> list[RemotingCommand]:
    decoder = FrameDecoder(max_frame_bytes=max_frame_bytes)
    return [cmd for piece in pieces for cmd in decoder.feed(piece)]


def decode_or_error(pieces: list[bytes],
                    max_frame_bytes: int = 1 << 20) -> list[RemotingCommand] | FrameError:
    """Commands or the `FrameError`; any other exception fails the test."""
    try:
        return decode(pieces, max_frame_bytes)
    except FrameError as err:
        return err


def assert_same(got: RemotingCommand, sent: RemotingCommand) -> None:
    assert (got.code, got.opaque, got.flag, got.version, got.remark) == (
        sent.code, sent.opaque, sent.flag, sent.version, sent.remark)
    assert got.fields == sent.fields
    assert got.body_bytes() == sent.body_bytes()
    assert isinstance(got.body, bytes)


# -- round trips ------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(commands(), min_size=1, max_size=5), st.data())
def test_frames_round_trip_at_any_chunking(cmds: list[RemotingCommand], data: st.DataObject) -> None:
    wire = b"".join(encode_frame_bytes(c) for c in cmds)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(wire)), max_size=12), label="cuts")
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    decoded = [c for piece in chunk(wire, cuts) for c in decoder.feed(piece)]
    assert len(decoded) == len(cmds)
    for got, sent in zip(decoded, cmds, strict=True):
        assert_same(got, sent)
    assert decoder.buffered_bytes == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(commands(), min_size=1, max_size=3))
def test_frames_round_trip_one_byte_at_a_time(cmds: list[RemotingCommand]) -> None:
    wire = b"".join(encode_frame_bytes(c) for c in cmds)
    decoded = decode([wire[i:i + 1] for i in range(len(wire))])
    for got, sent in zip(decoded, cmds, strict=True):
        assert_same(got, sent)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1), EXT_MAPS, BODIES)
def test_frame_layout_and_unjoined_body(opaque: int, fields: dict[str, Any], body: Any) -> None:
    cmd = RemotingCommand(code=10, opaque=opaque, fields=fields, body=body)
    buffers = encode_frame(cmd)
    wire = encode_frame_bytes(cmd)
    frame_length, header_length = struct.unpack_from(">II", wire)
    assert frame_length == len(wire) - 4 == 4 + header_length + cmd.body_length()
    header = msgpack.unpackb(wire[8:8 + header_length], raw=False, strict_map_key=False)
    assert set(header) == set(_HEADER_KEYS)   # every header carries all six keys
    assert header["ext"] == fields
    if isinstance(body, list):                 # a multi-buffer body is written as the same buffers
        assert all(a is b for a, b in zip(buffers[1:], body, strict=True))


def test_request_and_response_helpers_set_flags() -> None:
    req = request(11, {"topic": "t"}, body=b"x", oneway=True)
    assert req.is_oneway and not req.is_response and req.fields == {"topic": "t"}
    req.opaque = 42
    resp = req.response(code=19, header={"next_begin_offset": 3}, remark="held")
    assert resp.is_response and resp.opaque == 42 and resp.flag == CommandFlag.RESPONSE
    assert (resp.code, resp.fields, resp.remark) == (19, {"next_begin_offset": 3}, "held")


def test_minimal_header_gets_defaults() -> None:
    (cmd,) = decode([frame(packed({"code": 10, "opaque": 1, "ext": None}))])
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version, cmd.remark, cmd.fields) == (10, 1, 0, 1, None, {})


# -- malformed input -------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=300), max_size=6))
def test_random_bytes_decode_or_raise_frame_error(data: bytes, cuts: list[int]) -> None:
    decode_or_error(chunk(data, cuts), max_frame_bytes=256)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=40), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_random_header_bytes_and_lengths(header: bytes, body: bytes, fl: int, hl: int) -> None:
    decode_or_error([frame(header, body)])
    decode_or_error([frame(header, body, header_length=hl)], max_frame_bytes=1024)
    decode_or_error([frame(header, body, frame_length=fl, header_length=hl)], max_frame_bytes=1024)


@settings(max_examples=200, deadline=None)
@given(commands(), st.data())
def test_mutated_valid_frame(cmd: RemotingCommand, data: st.DataObject) -> None:
    wire = bytearray(encode_frame_bytes(cmd))
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        index = data.draw(st.integers(0, len(wire) - 1), label="index")
        wire[index] = data.draw(st.integers(0, 255), label="byte")
    decode_or_error([bytes(wire)])


@st.composite
def header_maps(draw: st.DrawFn) -> dict[Any, Any]:
    """A header map whose six keys are each absent, well typed or any msgpack value, plus junk keys."""
    extra = draw(st.dictionaries(MAP_KEYS, VALUES, max_size=3))
    header: dict[Any, Any] = {k: v for k, v in extra.items() if k not in _HEADER_KEYS}
    for key in _HEADER_KEYS:
        value = draw(st.one_of(st.just(_ABSENT), _GOOD[key], VALUES), label=key)
        if value is not _ABSENT:
            header[key] = value
    return header


def _is_int(value: Any) -> bool:
    return type(value) is int


def _header_is_valid(h: dict[Any, Any]) -> bool:
    ext = h.get("ext")
    return (_is_int(h.get("code")) and _is_int(h.get("opaque")) and _is_int(h.get("flag", 0))
            and _is_int(h.get("version", 1)) and (h.get("remark") is None or type(h["remark"]) is str)
            and (ext is None or (isinstance(ext, dict) and all(type(k) is str for k in ext))))


@settings(max_examples=300, deadline=None)
@given(header_maps(), st.binary(max_size=16))
def test_header_map_validity_and_readable_opaque(header: dict[Any, Any], body: bytes) -> None:
    result = decode_or_error([frame(packed(header), body)])
    if _header_is_valid(header):
        assert isinstance(result, list)
        (cmd,) = result
        assert (cmd.code, cmd.opaque, cmd.flag, cmd.version) == (
            header["code"], header["opaque"], header.get("flag", 0), header.get("version", 1))
        assert cmd.remark == header.get("remark") and cmd.fields == (header.get("ext") or {})
        assert cmd.body == body
    else:
        assert isinstance(result, FrameError)
        opaque = header.get("opaque")
        assert result.opaque == (opaque if _is_int(opaque) else None)


@pytest.mark.parametrize(("header", "opaque"), [
    ({"code": 10, "opaque": 7, "ext": [1, 2]}, 7),            # ext not a map
    ({"code": 10, "opaque": 7, "ext": "k=v"}, 7),
    ({"code": 10, "opaque": 7, "ext": {1: "int key"}}, 7),
    ({"opaque": 7}, 7),                                       # code missing
    ({"code": True, "opaque": 7}, 7),
    ({"code": "10", "opaque": 7}, 7),
    ({"code": 10.0, "opaque": 7}, 7),
    ({"code": 10, "opaque": 7, "flag": "1"}, 7),
    ({"code": 10, "opaque": 7, "version": False}, 7),
    ({"code": 10, "opaque": 7, "remark": 5}, 7),
    ({"code": 10}, None),                                     # opaque missing
    ({"code": 10, "opaque": True}, None),
    ({"code": 10, "opaque": "7"}, None),
    ({}, None),
    ([10, 7], None),                                          # header is an array
    (10, None),                                               # header is an int
    (None, None),
])
def test_bad_header_raises_frame_error_with_readable_opaque(header: Any, opaque: int | None) -> None:
    with pytest.raises(FrameError) as info:
        decode([frame(packed(header))])
    assert info.value.opaque == opaque


@pytest.mark.parametrize("wire", [
    frame(b"", header_length=0),                                         # empty header
    frame(packed({"code": 1, "opaque": 1}) + b"\xc0", body=b""),         # two values in the header
    frame(b"\xc1"),                                                      # never-used msgpack byte
    frame(b"\xa3ab"),                                                    # truncated string
    frame(b"\xa2\xff\xfe"),                                              # string that is not UTF-8
    frame(packed({"code": 1, "opaque": 1}), frame_length=3),             # frame_length < 4
    frame(packed({"code": 1, "opaque": 1}), frame_length=0),
    frame(packed({"code": 1, "opaque": 1}), b"body", header_length=100),  # header_length > frame
])
def test_bad_lengths_and_header_bytes_raise_frame_error(wire: bytes) -> None:
    with pytest.raises(FrameError) as info:
        decode([wire])
    assert info.value.opaque is None


def test_oversized_frame_is_refused_from_its_lengths_alone() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(FrameError, match="max_frame_bytes"):
        decoder.feed(struct.pack(">II", 1025, 10))    # only the 8 length bytes have arrived
    with pytest.raises(FrameError, match="max_frame_bytes"):
        decode([frame(b"\x80", bytes(1021))], max_frame_bytes=1024)   # frame_length 1026


def test_frame_of_exactly_max_frame_bytes_is_accepted() -> None:
    header = packed({"code": 1, "opaque": 1})
    wire = frame(header, bytes(1024 - 4 - len(header)))
    (cmd,) = decode([wire], max_frame_bytes=1024)
    assert cmd.body_length() == 1024 - 4 - len(header)
    with pytest.raises(FrameError):
        decode([wire], max_frame_bytes=1023)


def test_incomplete_frame_waits_for_more_bytes() -> None:
    wire = encode_frame_bytes(RemotingCommand(code=10, opaque=3, body=b"payload"))
    decoder = FrameDecoder()
    assert decoder.feed(wire[:-1]) == []
    assert decoder.buffered_bytes == len(wire) - 1
    (cmd,) = decoder.feed(wire[-1:])
    assert cmd.body == b"payload" and decoder.buffered_bytes == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(commands(), min_size=1, max_size=6), st.integers(1, 4), st.data())
def test_frames_decoded_a_few_at_a_time_come_out_whole_and_in_order(
        cmds: list[RemotingCommand], limit: int, data: st.DataObject) -> None:
    wire = b"".join(encode_frame_bytes(c) for c in cmds)
    cut = data.draw(st.integers(0, len(wire)), label="cut")
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    out = decoder.feed(wire[:cut], limit)
    assert len(out) <= limit
    while decoder.more:                     # whole frames wait as bytes until taken
        assert len(out) % limit == 0
        taken = decoder.feed(b"", limit)
        assert 0 < len(taken) <= limit
        out += taken
    out += decoder.feed(wire[cut:], 0)
    assert len(out) == len(cmds) and not decoder.more and decoder.buffered_bytes == 0
    for got, sent in zip(out, cmds, strict=True):
        assert_same(got, sent)
