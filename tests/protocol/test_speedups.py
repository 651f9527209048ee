"""The optional C module `protocol._speedups` against its pure-Python twins (`decode_message_batch`,
the frame decoder and encoder): the same result for every input, and the same exception type and
message for every bad one."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.twins import frames_outcome
from protocol import frame, message, native
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import FrameError, ProtocolError
from protocol.message import MessageExt, decode_message_batch_py, encode_stored_message
from tests.protocol import test_frame
from tests.protocol.strategies import chunk, commands
from tests.protocol.test_frame import header_maps, packed
from tests.protocol.test_message import _FIELDS, _GOOD, _with, stored_messages

speedups: Any = native.speedups()    # configured by the modules that use it; None under RQ_PURE_PYTHON

needs_c = pytest.mark.skipif(speedups is None,
                             reason="protocol._speedups was not built (no C compiler?) or RQ_PURE_PYTHON is set")


def outcome(decode: Callable[[bytes], list[MessageExt]], body: bytes) -> Any:
    """The decoded messages, or (exception type, message, cause type) of what `decode` raised."""
    try:
        return decode(body)
    except Exception as exc:
        cause = type(exc.__cause__) if exc.__cause__ is not None else None
        return type(exc), str(exc), cause


def assert_same(body: bytes) -> None:
    python = outcome(decode_message_batch_py, body)
    c = outcome(speedups.decode_message_batch, body)
    assert c == python
    if isinstance(python, tuple):
        assert issubclass(python[0], ProtocolError), python


@needs_c
def test_the_c_decoder_is_the_default_when_built() -> None:
    assert message.decode_message_batch is speedups.decode_message_batch


def test_rq_pure_python_selects_the_python_decoder() -> None:
    script = "import protocol.message as m; print(m.decode_message_batch is m.decode_message_batch_py)"
    env = {**os.environ, "RQ_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(stored_messages(), max_size=6))
def test_c_decodes_stored_messages_as_python_does(sent: list[dict[str, Any]]) -> None:
    body = b"".join(encode_stored_message(**m) for m in sent)
    decoded = speedups.decode_message_batch(body)
    assert decoded == decode_message_batch_py(body)
    assert [type(m) for m in decoded] == [MessageExt] * len(sent)
    assert decoded == speedups.decode_message_batch(memoryview(body))


@needs_c
@pytest.mark.parametrize("body", [
    b"", _GOOD, _GOOD[:-1], _GOOD + _GOOD[:5], b"\xc1", msgpack.packb([1, 2, 3]), msgpack.packb({"topic": "t"}),
    b"\x91\x81\x91\x01\x02", _with(0, 5), _with(3, "0"), _with(3, -1), _with(3, 1.5), _with(1, True),
    _with(9, 5), _with(9, "1.2.3.4:port"), _with(11, {"TAGS": 1}), _with(11, {1: "a"}), _with(12, "not bin"),
    _with(3, 2**64 - 1), _with(3, 2**63), _with(3, -(2**63)), _with(7, None), _with(10, 2**64 - 1),
    msgpack.packb([*_FIELDS, 1]), msgpack.packb(_FIELDS[:-1]), msgpack.packb(tuple(_FIELDS)),
    b"\xa3\xff\xfe\xfd",                                   # a str that is not UTF-8
])
def test_c_fails_as_python_does_on_malformed_bodies(body: bytes) -> None:
    assert_same(body)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=3),
       st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=4))
def test_c_agrees_with_python_on_corrupted_bodies(noise: bytes, cuts: list[int],
                                                  flips: list[tuple[int, int]]) -> None:
    mutated = bytearray(_GOOD + _GOOD)
    for position, value in flips:
        mutated[position % len(mutated)] = value
    for body in [noise, _GOOD + noise, bytes(mutated), *chunk(_GOOD + noise, cuts)]:
        assert_same(body)


@needs_c
def test_c_decoder_refuses_to_run_unconfigured_or_with_a_bad_class() -> None:
    class NoSlots:
        pass
    with pytest.raises(TypeError):
        speedups.configure(NoSlots, message.msg_id_prefix, ProtocolError)
    assert speedups.decode_message_batch(_GOOD) == decode_message_batch_py(_GOOD)   # still configured


# -- frames ----------------------------------------------------------------------------------------

def assert_same_frames(buf: bytes, max_frame_bytes: int = 1 << 20) -> None:
    python = frames_outcome(buf, max_frame_bytes, frame.decode_frames_py)
    assert frames_outcome(buf, max_frame_bytes, speedups.decode_frames) == python
    if isinstance(python[0], type):
        assert issubclass(python[0], FrameError), python


@needs_c
def test_the_c_frame_functions_are_the_default_when_built() -> None:
    assert frame._decode_frames is speedups.decode_frames
    assert frame._c_frame_bytes is speedups.frame_bytes


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(commands(), max_size=4), st.data())
def test_c_decodes_frames_as_python_does(cmds: list[RemotingCommand], data: st.DataObject) -> None:
    wire = b"".join(frame.encode_frame_bytes(c) for c in cmds)
    cut = data.draw(st.integers(0, len(wire)), label="cut")       # a partial frame at the end
    for buf in (wire, wire[:cut], bytearray(wire)):
        assert_same_frames(bytes(buf))
    assert speedups.decode_frames(bytearray(wire), 1 << 20)[1] == len(wire)


@needs_c
@settings(max_examples=300, deadline=None)
@given(header_maps(), st.binary(max_size=16), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_c_checks_headers_and_lengths_as_python_does(header: dict[Any, Any], body: bytes, fl: int, hl: int) -> None:
    raw = packed(header)
    assert_same_frames(test_frame.frame(raw, body))
    assert_same_frames(test_frame.frame(raw, body, header_length=hl), 1024)
    assert_same_frames(test_frame.frame(raw, body, frame_length=fl, header_length=hl), 1024)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), commands(), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4))
def test_c_agrees_with_python_on_random_and_mutated_frames(noise: bytes, cmd: RemotingCommand,
                                                           flips: list[tuple[int, int]]) -> None:
    wire = bytearray(frame.encode_frame_bytes(cmd))
    for position, value in flips:
        wire[position % len(wire)] = value
    for buf in (noise, bytes(wire), bytes(wire) + noise):
        assert_same_frames(buf, 256)
        assert_same_frames(buf)


# Map keys for the C decoder's key cache (256 slots by the bytes' hash): more than it holds, so
# slots are shared and replaced; keys of equal length that differ in one byte; non-ASCII keys;
# the longest cached length (31 bytes) and one past it.
_CACHE_KEYS = ([f"k{i}" for i in range(600)] + [f"topic{c}" for c in "abcdefgh"] + ["é", "ключ", "键" * 10]
               + ["x" * 31, "x" * 30 + "y", "x" * 32])
_SMALL_VALUES = st.one_of(st.text(max_size=4), st.integers(-2**63, 2**63 - 1))


@needs_c
@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(_CACHE_KEYS), _SMALL_VALUES), max_size=40), min_size=1, max_size=12),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3))
def test_c_decodes_recurring_map_keys_as_python_does(maps: list[list[tuple[str, Any]]],
                                                      flips: list[tuple[int, int]]) -> None:
    """Frames in a row whose ext keys recur, share cache slots and are replaced (and some bytes
    flipped: a key's bytes changed after it was cached) decode as Python decodes them, every str
    key interned."""
    wire = bytearray(b"".join(test_frame.frame(packed({"code": 10, "opaque": i, "flag": 0, "ext": dict(m)}))
                              for i, m in enumerate(maps)))
    assert_same_frames(bytes(wire))
    cmds, _ = speedups.decode_frames(bytes(wire), 1 << 20)
    assert [list(c.fields) for c in cmds] == [list(dict(m)) for m in maps]
    assert all(sys.intern(key) is key for c in cmds for key in c.fields)
    for position, value in flips:
        wire[position % len(wire)] = value
    assert_same_frames(bytes(wire))


def _usual(cmd: RemotingCommand, max_body_bytes: int) -> bool:
    """What the C encoder takes: 64-bit int fields (IntEnums too), a body of buffers within the limit."""
    ints = (cmd.code, cmd.opaque, cmd.flag, cmd.version)
    return all(-(2**63) <= v < 2**64 and type(v) is not bool for v in ints) and cmd.body_length() <= max_body_bytes


@needs_c
@settings(max_examples=300, deadline=None)
@given(commands(), st.binary(max_size=5000), st.integers(0, 6000))
def test_c_encodes_frames_as_python_does(cmd: RemotingCommand, body: bytes, max_body_bytes: int) -> None:
    for candidate in (cmd, dataclasses.replace(cmd, body=body)):
        python = b"".join(bytes(part) for part in frame.encode_frame_py(candidate))
        data = speedups.frame_bytes(candidate, max_body_bytes)
        assert (data is not None) == _usual(candidate, max_body_bytes), candidate
        if data is not None:
            assert data == python
            assert frame.frame_bytes(candidate, max_body_bytes) == data
        else:
            assert frame.frame_bytes(candidate, max_body_bytes) == (
                python if candidate.body_length() <= max_body_bytes else None)
        assert b"".join(bytes(p) for p in frame.encode_frame(candidate)) == python


@needs_c
def test_c_encoder_leaves_unusual_frames_to_python() -> None:
    nested: Any = [b"x", [b"y"]]
    unusual = [RemotingCommand(True, 1, 1), RemotingCommand(0, 1, 1, body=nested),
               RemotingCommand(0, 1, 1, body=memoryview(b"abcd").cast("I")),
               RemotingCommand(0, 1, 1, remark="\ud800"), RemotingCommand(0, 1, 1, fields={"x": object()}),
               RemotingCommand(0, 2**64, 1), RemotingCommand(0, 1, 1, body=b"x" * 101)]
    for cmd in unusual:
        assert speedups.frame_bytes(cmd, 100) is None
    enum_code = RemotingCommand(ResponseCode.PULL_NOT_FOUND, 1, 1, "held", {"k": 1}, [memoryview(b"ab"), b"c"])
    assert speedups.frame_bytes(enum_code, 100) == b"".join(bytes(p) for p in frame.encode_frame_py(enum_code))


@needs_c
def test_a_released_buffer_is_refused_as_python_refuses_it() -> None:
    released = memoryview(b"abc")
    released.release()
    cmd = RemotingCommand(0, 1, 1, body=[memoryview(b"ok"), released])
    assert speedups.frame_bytes(cmd, 100) is None
    with pytest.raises(ValueError, match="released"):
        frame.frame_bytes(cmd, 100)


@needs_c
@given(st.from_regex(r"[0-9A-F]{16}", fullmatch=True),
       st.lists(st.one_of(st.integers(0, 2**64 - 1), st.integers(-5, 2**65)), max_size=40))
def test_c_makes_a_batchs_offset_msg_ids_as_python_does(prefix: str, offsets: list[int]) -> None:
    assert message.offset_msg_ids(prefix, offsets) == message.offset_msg_ids_py(prefix, offsets)
    if all(0 <= offset < 2**64 for offset in offsets):
        assert speedups.offset_msg_ids(prefix, offsets) == message.offset_msg_ids_py(prefix, offsets)


@needs_c
@pytest.mark.parametrize(("prefix", "offsets"), [
    ("C0A8000100002A9F", [1, -1]),                 # an offset below 0
    ("C0A8000100002A9F", [2**64]),                 # an offset past 64 bits
    ("C0A8000100002A9F", [True]),                  # not an int
    ("C0A80001", [1]),                             # a prefix of another length
    ("C0A8000100002A9É", [1]),                     # a prefix that is not ASCII
])
def test_c_leaves_unusual_offset_msg_ids_to_python(prefix: str, offsets: list[Any]) -> None:
    assert speedups.offset_msg_ids(prefix, offsets) is None
    assert message.offset_msg_ids(prefix, offsets) == message.offset_msg_ids_py(prefix, offsets)


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(commands(), max_size=5), st.integers(-1, 4), st.data())
def test_c_decodes_at_most_max_commands_frames_as_python_does(cmds: list[RemotingCommand], max_commands: int,
                                                              data: st.DataObject) -> None:
    wire = b"".join(frame.encode_frame_bytes(c) for c in cmds)
    buf = wire[:data.draw(st.integers(0, len(wire)), label="cut")]
    python = frames_outcome(buf, 1 << 20, frame.decode_frames_py, max_commands)
    assert frames_outcome(buf, 1 << 20, speedups.decode_frames, max_commands) == python
    if max_commands > 0:
        assert len(python[0]) <= max_commands
