"""Delay-level math: parsing `store.message_delay_level`, due times and RocketMQ's clamp."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.schedule.delay_levels import (
    UNKNOWN_LEVEL_DELAY_MS,
    DelayLevelError,
    clamp_level,
    countdown_ms,
    deliver_at_ms,
    level_of,
    parse_delay_levels,
    queue_id_of,
)
from conf.store import StoreConfig


def test_the_default_levels_are_rocketmqs_eighteen() -> None:
    levels = parse_delay_levels(StoreConfig().message_delay_level)
    assert len(levels) == 18
    assert levels[:5] == (1_000, 5_000, 10_000, 30_000, 60_000)
    assert levels[-2:] == (3_600_000, 7_200_000)


@pytest.mark.parametrize(("text", "expected"), [
    ("100ms 1s 2m 3h 1d", (100, 1_000, 120_000, 10_800_000, 86_400_000)),
    ("  5s   10s ", (5_000, 10_000)),
    ("0s", (0,)),
    ("1S 2M", (1_000, 120_000)),
])
def test_units(text: str, expected: tuple[int, ...]) -> None:
    assert parse_delay_levels(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "1", "1x", "s", "-1s", "1.5s", "1s,2s"])
def test_bad_level_lists_name_the_entry(text: str) -> None:
    with pytest.raises(DelayLevelError):
        parse_delay_levels(text)


def test_clamp_and_queue_ids() -> None:
    levels = (100, 200, 300)
    assert [clamp_level(n, levels) for n in (-5, 0, 1, 3, 4, 99)] == [0, 0, 1, 3, 3, 3]
    assert [queue_id_of(n) for n in (1, 2, 3)] == [0, 1, 2]
    assert [level_of(q) for q in (0, 1, 2)] == [1, 2, 3]


def test_due_times() -> None:
    levels = (100, 200, 300)
    assert deliver_at_ms(1_000, 2, levels) == 1_200
    assert deliver_at_ms(1_000, 9, levels) == 1_000 + UNKNOWN_LEVEL_DELAY_MS
    assert countdown_ms(1_200, 1_000, 2, levels) == 200
    assert countdown_ms(1_200, 1_300, 2, levels) == -100
    # A due time more than one level-delay ahead means the clock went back: deliver now.
    assert countdown_ms(5_000, 1_000, 2, levels) == 0


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["ms", "s", "m", "h", "d"])),
                min_size=1, max_size=20))
def test_parse_round_trips_any_well_formed_list(entries: list[tuple[int, str]]) -> None:
    unit_ms = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    text = " ".join(f"{n}{unit}" for n, unit in entries)
    assert parse_delay_levels(text) == tuple(n * unit_ms[unit] for n, unit in entries)
