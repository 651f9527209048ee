"""auth.enforcer's `known_key` (the key a connection's allowed requests are remembered by): the C
one (`auth._checks.known_key`, when built) gives what its twin `known_key_py` gives, for fields of
every kind of value (unhashable ones too), missing names, and fields that are not a dict."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auth.enforcer import known_key_py
from protocol.native import load

_CHECKS = load("auth._checks")
NAMES = ("a", "b", "topic")
values = st.one_of(st.none(), st.integers(), st.text(max_size=4), st.binary(max_size=4), st.booleans(),
                   st.lists(st.integers(), max_size=2), st.tuples(st.integers()),
                   st.dictionaries(st.text(), st.integers(), max_size=1))
fields = st.one_of(st.dictionaries(st.sampled_from(NAMES), values), st.lists(st.integers(), max_size=2), st.none())


def _keys(drawn: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    keys = set()
    for key in drawn:
        with contextlib.suppress(TypeError):
            keys.add(key)
    return keys


@pytest.mark.skipif(_CHECKS is None, reason="auth._checks was not built (or RQ_PURE_PYTHON is set)")
@settings(max_examples=500, deadline=None)
@given(request=fields, names=st.lists(st.sampled_from(NAMES), max_size=3).map(tuple),
       remembered=st.lists(st.tuples(st.sampled_from(["u", "v"]), st.sampled_from([10, 11]), values), max_size=4),
       username=st.sampled_from(["u", "v"]), code=st.sampled_from([10, 11]), frozen=st.booleans())
def test_the_c_known_key_gives_what_its_twin_gives(request: Any, names: tuple[str, ...],
                                                   remembered: list[tuple[Any, ...]], username: str, code: int,
                                                   frozen: bool) -> None:
    assert _CHECKS is not None
    keys = _keys(remembered)
    if isinstance(request, dict) and remembered and len(names) == 1:    # a key that is there
        value = request.get(names[0])
        with contextlib.suppress(TypeError):
            keys.add((username, code, value))
    allowed = frozenset(keys) if frozen else keys
    assert _CHECKS.known_key(allowed, username, code, request, names) == known_key_py(
        allowed, username, code, request, names)


def test_a_key_is_known_once_remembered_and_not_for_other_values() -> None:
    implementations = [known_key_py] + ([_CHECKS.known_key] if _CHECKS is not None else [])
    for known_key in implementations:
        allowed: set[tuple[object, ...]] = set()
        key = known_key(allowed, "alice", 10, {"b": "orders", "x": 1}, ("b",))
        assert key == ("alice", 10, "orders")
        allowed.add(key)
        assert known_key(allowed, "alice", 10, {"b": "orders", "x": 2}, ("b",)) is True
        assert known_key(allowed, "alice", 10, {"b": "other"}, ("b",)) == ("alice", 10, "other")
        assert known_key(allowed, "bob", 10, {"b": "orders"}, ("b",)) == ("bob", 10, "orders")
        assert known_key(allowed, "alice", 10, {}, ("b",)) == ("alice", 10, None)
        assert known_key(allowed, "alice", 10, {"b": ["not", "hashable"]}, ("b",)) is None
