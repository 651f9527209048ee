"""SEND_BATCH_MESSAGE bodies: the C reader (`protocol._speedups.read_batch_body`) takes exactly the
bodies the Python checks accept, with the same items; every other body gets the Python error."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.processors import send_message
from broker.processors.send_message import MAX_BATCH_MESSAGES, decode_batch, decode_batch_py
from protocol.errors import MessageIllegal
from tests.protocol.strategies import VALUES

MAX_BYTES = 64

needs_c = pytest.mark.skipif(send_message._read_batch_body is None,
                             reason="protocol._speedups was not built (no C compiler?)")
TEXT = st.text(max_size=6)
ITEMS = st.lists(st.one_of(
    st.tuples(st.dictionaries(TEXT | st.just("DELAY"), TEXT, max_size=3), st.integers(-(2**63), 2**64 - 1),
              st.binary(max_size=80)).map(list),
    VALUES), max_size=5)


def outcome(raw: bytes, decode: Any) -> Any:
    try:
        return decode(raw, MAX_BYTES)
    except MessageIllegal as exc:
        return MessageIllegal, str(exc)


@needs_c
@settings(max_examples=400, deadline=None)
@given(ITEMS, st.binary(max_size=4))
def test_c_reads_batches_as_python_checks_them(items: list[Any], noise: bytes) -> None:
    raw = msgpack.packb(items, use_bin_type=True)
    for body in (raw, raw + noise, raw[:-1] if raw else raw):
        assert outcome(body, decode_batch) == outcome(body, decode_batch_py)


@needs_c
def test_c_leaves_edge_batches_to_python() -> None:
    too_many = msgpack.packb([[{}, 0, b""]] * (MAX_BATCH_MESSAGES + 1), use_bin_type=True)
    int_key = msgpack.packb([[{1: "x"}, 0, b""]], use_bin_type=True)
    bool_flag = msgpack.packb([[{}, True, b""]], use_bin_type=True)
    read: Any = send_message._read_batch_body
    for raw in (too_many, int_key, bool_flag, msgpack.packb([], use_bin_type=True), b"\xc1"):
        assert read(raw, MAX_BATCH_MESSAGES, MAX_BYTES) is None
        with pytest.raises(MessageIllegal):
            decode_batch(raw, MAX_BYTES)
