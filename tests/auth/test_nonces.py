"""auth.nonces.NonceCache as a state machine: whatever the order, timestamps and bound, a frame
(its nonce and signed timestamp) is never accepted twice and memory stays within the bound; below
the bound, a nonce is not accepted twice within the window whatever its timestamps. Each test runs
on the pure-Python cache and on the C one (`auth._checks`, when built), and the two give the same
verdict, size and floor at every step of the same sequence."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auth.nonces import NonceCache, Nonces
from protocol.native import load

_NATIVE = load("auth._checks")
IMPLEMENTATIONS: list[Callable[..., Nonces]] = [NonceCache]
if _NATIVE is not None:
    IMPLEMENTATIONS.append(_NATIVE.NonceCache)
implementations = pytest.mark.parametrize("make", IMPLEMENTATIONS, ids=lambda kind: kind.__module__)

WINDOW_MS = 5_000
steps = st.lists(st.tuples(st.integers(0, 30), st.integers(-7_000, 7_000), st.integers(0, 400)),
                 min_size=1, max_size=300)


@implementations
@settings(max_examples=300, deadline=None)
@given(steps=steps, bound=st.one_of(st.integers(1, 40), st.just(1_000)))
def test_no_frame_is_accepted_twice_and_the_bound_holds(make: Callable[..., Nonces],
                                                         steps: list[tuple[int, int, int]], bound: int) -> None:
    cache = make(WINDOW_MS, bound)
    now_ms = 100_000
    accepted: set[tuple[str, int]] = set()
    for nonce_id, skew_ms, advance_ms in steps:
        now_ms += advance_ms
        nonce, timestamp_ms = f"n{nonce_id}", now_ms + skew_ms
        verdict = cache.check(nonce, timestamp_ms, now_ms)
        if abs(skew_ms) > WINDOW_MS:
            assert verdict == "expired"
        if verdict is None:
            assert (nonce, timestamp_ms) not in accepted            # a replayed frame
            if bound >= len(steps):                                  # nothing forgotten early
                assert not any(n == nonce and now_ms - t <= WINDOW_MS for n, t in accepted)
            accepted.add((nonce, timestamp_ms))
        assert len(cache) <= bound


@implementations
def test_a_replay_is_refused_and_a_new_nonce_accepted(make: Callable[..., Nonces]) -> None:
    cache = make(60_000)
    assert cache.check("a" * 32, 1_000_000, 1_000_000) is None
    assert cache.check("a" * 32, 1_000_000, 1_000_500) == "replayed"
    assert cache.check("b" * 32, 1_000_000, 1_000_500) is None
    assert cache.check("c" * 32, 900_000, 1_000_500) == "expired"


@implementations
def test_over_the_bound_older_timestamps_are_refused_rather_than_forgotten(
        make: Callable[..., Nonces]) -> None:
    cache = make(60_000, max_entries=2)
    for i, second in enumerate((1_000, 1_001, 1_002)):
        assert cache.check(f"n{i}", second * 1000, 1_002_000) is None
    assert len(cache) <= 2 and cache.floor_ms >= 1_000_999
    assert cache.check("n0", 1_000_000, 1_002_000) == "expired"      # forgotten, so refused by time
    assert cache.check("n9", 1_003_000, 1_003_000) is None


@pytest.mark.skipif(_NATIVE is None, reason="auth._checks was not built (or RQ_PURE_PYTHON is set)")
@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 30), st.integers(-9_000, 9_000), st.integers(-2_000, 3_000)),
                      min_size=1, max_size=300),
       window_ms=st.integers(0, 6_000), bound=st.integers(1, 40), start_ms=st.integers(-5_000, 5_000))
def test_the_c_cache_gives_what_its_twin_gives_at_every_step(steps: list[tuple[int, int, int]], window_ms: int,
                                                            bound: int, start_ms: int) -> None:
    """Clocks that go back too (a negative advance), timestamps around zero and a zero window."""
    assert _NATIVE is not None
    twin, native = NonceCache(window_ms, bound), _NATIVE.NonceCache(window_ms, bound)
    now_ms = start_ms
    for nonce_id, skew_ms, advance_ms in steps:
        now_ms += advance_ms
        nonce, timestamp_ms = f"n{nonce_id}", now_ms + skew_ms
        assert native.check(nonce, timestamp_ms, now_ms) == twin.check(nonce, timestamp_ms, now_ms)
        assert (len(native), native.floor_ms) == (len(twin), twin.floor_ms)


@pytest.mark.skipif(_NATIVE is None, reason="auth._checks was not built (or RQ_PURE_PYTHON is set)")
def test_the_c_cache_refuses_what_it_cannot_hold_as_its_twin_would() -> None:
    assert _NATIVE is not None
    for bad in ((-1,), (0, 0)):
        with pytest.raises(ValueError, match="window_ms must be"):
            _NATIVE.NonceCache(*bad)
    native, twin = _NATIVE.NonceCache(60_000), NonceCache(60_000)
    for timestamp_ms in (2**62 + 1, -(2**62) - 1, 2**80):          # far beyond any clock: expired in both
        assert native.check("n" * 16, timestamp_ms, 1_000_000) == twin.check("n" * 16, timestamp_ms, 1_000_000)
    with pytest.raises(OverflowError):
        native.check("n" * 16, 0, 2**61 + 1)
    with pytest.raises(TypeError):
        native.check(["unhashable"], 1_000_000, 1_000_000)
    assert len(native) == 0
