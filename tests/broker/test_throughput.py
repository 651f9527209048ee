"""`broker.throughput.Throughput`, the rates GET_BROKER_RUNTIME_INFO answers (put_tps, get_tps):
bounded readings, never negative, exact for steady counting, and 0.0 when a total goes back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.throughput import Throughput


@given(st.lists(st.tuples(st.integers(0, 5_000), st.integers(0, 1_000), st.integers(0, 1_000)), max_size=300))
def test_readings_stay_bounded_and_rates_are_never_negative(steps: list[tuple[int, int, int]]) -> None:
    throughput = Throughput(0, window_ms=10_000, min_gap_ms=1_000)
    now_ms = put = got = 0
    for advance_ms, puts, gets in steps:
        now_ms, put, got = now_ms + advance_ms, put + puts, got + gets
        put_tps, get_tps = throughput.rates(now_ms, put, got)
        assert put_tps >= 0 and get_tps >= 0
        assert len(throughput) <= 10_000 // 1_000 + 2


@given(st.integers(1, 1_000), st.integers(0, 1_000), st.integers(20, 200))
def test_steady_counting_gives_the_exact_rate(step_ms: int, per_step: int, steps: int) -> None:
    throughput = Throughput(0)
    for i in range(1, steps + 1):
        put_tps, get_tps = throughput.rates(i * step_ms, i * per_step, 2 * i * per_step)
        assert abs(put_tps - per_step * 1000 / step_ms) < 1e-6 * max(1.0, put_tps)
        assert abs(get_tps - 2 * put_tps) < 1e-6 * max(1.0, get_tps)


def test_a_total_that_went_back_reads_as_zero_and_no_time_as_zero() -> None:
    throughput = Throughput(1_000)
    assert throughput.rates(1_000, 5, 5) == (0.0, 0.0)          # no time since the start
    assert throughput.rates(3_000, 10, 20) == (5.0, 10.0)       # since the start: 2 s
    assert throughput.rates(4_000, 1, 1) == (0.0, 0.0)          # counters restarted
