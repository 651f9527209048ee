"""auth.nonces.NonceCache as a state machine: whatever the order, timestamps and bound, a frame
(its nonce and signed timestamp) is never accepted twice and memory stays within the bound; below
the bound, a nonce is not accepted twice within the window whatever its timestamps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from auth.nonces import NonceCache

WINDOW_MS = 5_000
steps = st.lists(st.tuples(st.integers(0, 30), st.integers(-7_000, 7_000), st.integers(0, 400)),
                 min_size=1, max_size=300)


@settings(max_examples=300, deadline=None)
@given(steps=steps, bound=st.one_of(st.integers(1, 40), st.just(1_000)))
def test_no_frame_is_accepted_twice_and_the_bound_holds(steps: list[tuple[int, int, int]], bound: int) -> None:
    cache = NonceCache(WINDOW_MS, bound)
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


def test_a_replay_is_refused_and_a_new_nonce_accepted() -> None:
    cache = NonceCache(60_000)
    assert cache.check("a" * 32, 1_000_000, 1_000_000) is None
    assert cache.check("a" * 32, 1_000_000, 1_000_500) == "replayed"
    assert cache.check("b" * 32, 1_000_000, 1_000_500) is None
    assert cache.check("c" * 32, 900_000, 1_000_500) == "expired"


def test_over_the_bound_older_timestamps_are_refused_rather_than_forgotten() -> None:
    cache = NonceCache(60_000, max_entries=2)
    for i, second in enumerate((1_000, 1_001, 1_002)):
        assert cache.check(f"n{i}", second * 1000, 1_002_000) is None
    assert len(cache) <= 2 and cache.floor_ms >= 1_000_999
    assert cache.check("n0", 1_000_000, 1_002_000) == "expired"      # forgotten, so refused by time
    assert cache.check("n9", 1_003_000, 1_003_000) is None
