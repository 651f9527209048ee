"""The optional C module `protocol._speedups` against its pure-Python twins: the same result for
every input, and the same exception type and message for every bad one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import message
from protocol.errors import ProtocolError
from protocol.message import MessageExt, decode_message_batch_py, encode_stored_message
from tests.protocol.strategies import chunk
from tests.protocol.test_message import _FIELDS, _GOOD, _with, stored_messages

speedups: Any = None
try:
    from protocol import _speedups  # type: ignore[attr-defined]
    speedups = _speedups
except ImportError:
    pass

needs_c = pytest.mark.skipif(speedups is None, reason="protocol._speedups was not built (no C compiler?)")


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
