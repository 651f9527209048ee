"""`protocol._speedups.canonical_bytes` (C) against its twin `protocol.signing.canonical_bytes_py`:
the same bytes for every ext map, None (the twin packs it) for what it does not take."""

from __future__ import annotations

import enum
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import native
from protocol.signing import SCHEME, SIGNATURE, canonical_bytes, canonical_bytes_py

speedups: Any = native.speedups()
pytestmark = pytest.mark.skipif(speedups is None, reason="protocol._speedups was not built or RQ_PURE_PYTHON is set")
DIGEST = hashlib.sha256(b"body").digest()
scalars = st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=40), st.booleans(), st.none(),
                    st.binary(max_size=300), st.floats(allow_nan=False))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=20), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(st.text(max_size=8), inner, max_size=20)), max_leaves=40)


class Code(enum.IntEnum):
    TEN = 10


@settings(max_examples=200, deadline=None)
@given(code=st.integers(0, 65_535), fields=st.dictionaries(st.text(max_size=20), values, max_size=20),
       signed=st.booleans())
def test_c_packs_every_plain_ext_map_as_the_twin(code: int, fields: dict[str, Any], signed: bool) -> None:
    if signed:
        fields[SIGNATURE] = "f" * 64
    assert speedups.canonical_bytes(SCHEME, code, fields, SIGNATURE, DIGEST) == canonical_bytes_py(code, fields,
                                                                                                    DIGEST)


def _nested(depth: int) -> object:
    value: object = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [Code.TEN, bytearray(b"x"), 2**64, -(2**63) - 1, "\ud800", {1: "int key"},
                                   _nested(40)])
def test_c_hands_what_is_not_plain_to_the_twin(value: object) -> None:
    assert speedups.canonical_bytes(SCHEME, 10, {"k": value}, SIGNATURE, DIGEST) is None


def test_canonical_bytes_falls_back_to_the_twin_with_its_errors() -> None:
    assert canonical_bytes(10, {"k": Code.TEN}, b"body") == canonical_bytes_py(10, {"k": 10}, DIGEST)
    with pytest.raises(TypeError):
        canonical_bytes(10, {"k": {1: "a", "b": 2}}, b"body")


@settings(max_examples=50, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=6), scalars, min_size=30, max_size=70),
       inner=st.dictionaries(st.text(max_size=6), scalars, min_size=30, max_size=70))
def test_c_packs_large_maps_as_the_twin(fields: dict[str, Any], inner: dict[str, Any]) -> None:
    """Maps of more than 32 items are sorted by another path than the ext maps of every request."""
    fields["nested"] = inner
    fields[SIGNATURE] = "f" * 64
    assert speedups.canonical_bytes(SCHEME, 10, fields, SIGNATURE, DIGEST) == canonical_bytes_py(10, fields, DIGEST)
