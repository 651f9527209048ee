"""The flights demo end to end on a small slice: the in-process test broker, 3,000 flights."""

from __future__ import annotations

import io

from rich.console import Console

from broker.broker import Broker
from demo import run_demo
from demo.flights import CarrierStats, expected_stats, read_flights


async def test_demo_replays_a_slice_and_every_carrier_matches(broker: Broker) -> None:
    out = io.StringIO()
    result = await run_demo(endpoint=broker.address, limit=3_000, timeout_s=15,
                            console=Console(file=out, width=120))
    assert result.ok, out.getvalue()
    assert result.figures is not None and result.figures.consumed == 3_000
    assert "Using the broker already listening on" in out.getvalue()


def test_missing_delays_are_counted_apart_not_as_zero() -> None:
    stats = CarrierStats()
    for delay in ("5", "NA", "-3", ""):
        stats.add(delay)
    assert stats == CarrierStats(flights=4, delay_sum=2, delay_missing=2)


def test_expected_stats_of_the_first_rows() -> None:
    flights = read_flights(limit=10)
    stats = expected_stats(flights)
    assert sum(s.flights for s in stats.values()) == 10
    assert stats["UA"].flights >= 1
