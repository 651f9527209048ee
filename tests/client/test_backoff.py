"""Capped exponential backoff."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.backoff import ExponentialBackoff


def test_doubles_from_base_up_to_cap() -> None:
    backoff = ExponentialBackoff(base_ms=100, cap_ms=1_000)
    assert [backoff.delay_ms(n) for n in range(7)] == [0, 100, 200, 400, 800, 1_000, 1_000]
    assert backoff.delay_ms(10_000) == 1_000


def test_degenerate_settings() -> None:
    assert ExponentialBackoff(0, 1_000).delay_ms(5) == 0
    assert ExponentialBackoff(500, 0).delay_ms(1) == 0
    assert ExponentialBackoff(500, 200).delay_ms(1) == 200


def test_rejects_negative_values() -> None:
    with pytest.raises(ValueError):
        ExponentialBackoff(-1, 10)
    with pytest.raises(ValueError):
        ExponentialBackoff(1, -10)
    with pytest.raises(ValueError):
        ExponentialBackoff(1, 10).delay_ms(-1)


@given(st.integers(0, 10_000), st.integers(0, 10**7), st.integers(0, 200))
def test_matches_the_formula(base_ms: int, cap_ms: int, failures: int) -> None:
    expected = 0 if failures == 0 else min(base_ms * 2 ** (failures - 1), cap_ms)
    assert ExponentialBackoff(base_ms, cap_ms).delay_ms(failures) == expected


@given(st.integers(1, 10_000), st.integers(0, 10**7), st.integers(0, 60), st.randoms())
def test_jitter_stays_between_half_and_full_delay(base_ms: int, cap_ms: int, failures: int,
                                                 rng: random.Random) -> None:
    backoff = ExponentialBackoff(base_ms, cap_ms)
    delay = backoff.delay_ms(failures)
    assert delay - delay // 2 <= backoff.jittered_delay_ms(failures, rng) <= delay


def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    backoff = ExponentialBackoff(100, 10_000)
    first = [backoff.jittered_delay_ms(n, random.Random(7)) for n in range(8)]
    assert first == [backoff.jittered_delay_ms(n, random.Random(7)) for n in range(8)]
