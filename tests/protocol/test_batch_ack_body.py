"""BATCH_ACK_MESSAGE's body codec (`BatchAckBody`): acks round-trip in order; any other msgpack value
(a wrong shape, a wrong type in any column, a negative or too large offset) is refused with
`MissingHeaderField`, never another error, and never decodes to something else."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.bodies import decode_batch_ack, encode_batch_ack
from protocol.errors import MissingHeaderField

acks_strategy = st.lists(st.tuples(st.integers(-(1 << 31), (1 << 31) - 1), st.text(max_size=60),
                                   st.integers(0, (1 << 63) - 1)), max_size=40)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(),
                    st.text(max_size=8), st.binary(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.one_of(st.text(max_size=4), st.integers(0, 9)), inner, max_size=3), max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(acks_strategy)
def test_acks_round_trip(acks: list[tuple[int, str, int]]) -> None:
    assert decode_batch_ack(encode_batch_ack(acks)) == acks


def _well_formed(value: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("acks"), list):
        return False
    return all(isinstance(a, list) and len(a) == 3 and type(a[0]) is int and type(a[1]) is str
               and type(a[2]) is int and 0 <= a[2] < 1 << 63 for a in value["acks"])


@settings(max_examples=200, deadline=None)
@given(st.one_of(values, st.fixed_dictionaries({"acks": st.lists(st.lists(values, max_size=4), max_size=4)}),
                 st.fixed_dictionaries({"acks": st.lists(st.tuples(values, values, values), max_size=4)})))
def test_anything_else_is_refused(value: Any) -> None:
    raw = msgpack.packb(value, use_bin_type=True)
    if _well_formed(value):
        assert decode_batch_ack(raw) == [tuple(a) for a in value["acks"]]
    else:
        with pytest.raises(MissingHeaderField):
            decode_batch_ack(raw)


@pytest.mark.parametrize("acks", [[[0, "h", -1]], [[0, "h", 1 << 63]], [[True, "h", 0]], [[0, b"h", 0]],
                                  [[0, "h"]], [[0, "h", 0, 0]], [[0, "h", 0], [0, "h"]], [{0: 1, "h": 2, 1: 3}],
                                  "abc", 5])
def test_each_wrong_shape_is_refused(acks: object) -> None:
    with pytest.raises(MissingHeaderField):
        decode_batch_ack(msgpack.packb({"acks": acks}))
