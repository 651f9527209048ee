"""The chaos run's pure parts, and its short version (3 fault cycles) end to end (issue 12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.checker import check_group
from chaos.hostile import HOSTILE_FAULTS
from chaos.measure import p99
from chaos.run import run_chaos
from chaos.schedule import FAULTS, TIMED_FAULTS, fault_schedule


def test_the_schedule_is_replayable_and_covers_every_fault_first() -> None:
    assert fault_schedule(42, 20, 4) == fault_schedule(42, 20, 4)
    assert fault_schedule(42, 20, 4) != fault_schedule(43, 20, 4)
    steps = fault_schedule(42, 20, 4)
    assert {s.fault for s in steps[:len(FAULTS)]} == set(FAULTS)
    assert {s.fault for s in fault_schedule(42, 2, 4, kinds=["broker-kill", "disk-fill"])} == {"broker-kill",
                                                                                             "disk-fill"}
    with pytest.raises(ValueError, match="unknown fault kinds"):
        fault_schedule(42, 2, 4, kinds=["meteor"])
    assert all(0 <= s.target < 4 for s in steps) and [s.cycle for s in steps] == list(range(1, 21))
    assert all(2.0 <= s.pause_s <= 4.0 for s in steps if s.fault in TIMED_FAULTS)


def test_the_checker_counts_lost_duplicates_and_reorderings() -> None:
    result = check_group(["a", "b", "c"], ["a", "b", "a"])
    assert (result.lost, result.duplicates, result.lost_examples) == (1, 1, ("c",))
    # a replay after a crash (duplicates) is not a reordering; a later key first seen early is
    replay = ["o:1:0", "o:1:1", "o:1:2", "o:1:1", "o:1:2", "o:1:3", "o:2:0"]
    assert check_group([], replay, orderly=True).reorderings == 0
    swapped = ["o:1:0", "o:1:2", "o:1:1", "o:1:3"]
    assert check_group([], swapped, orderly=True).reorderings == 1


@pytest.mark.timeout(150)
async def test_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    kinds = ["broker-kill", "consumer-kill", "topic-create-kill", "disk-fill"]
    report = await run_chaos(tmp_path, cycles=4, seed=20261123, run_s=(1.5, 2.5), drain_timeout_s=40, echo=False,
                             kinds=kinds)
    assert report.concurrent.acknowledged > 100 and report.orderly.acknowledged > 100
    assert report.concurrent.lost == 0, report.lines()
    assert report.orderly.lost == 0 and report.orderly.reorderings == 0, report.lines()
    # each fault's window reports the broker's RSS and the p99 of the sends acknowledged in it
    assert len(report.windows) == len(report.steps), report.lines()
    assert all(w.peak_rss_bytes > 0 and w.sends > 0 and w.p99_send_ms > 0 for w in report.windows), report.lines()
    assert all("p99 send" in line for line in report.lines()[1:1 + len(report.steps)])
    assert report.hostile_lost == 0 and len(report.hostile) == len([s for s in report.steps
                                                                     if s.fault in HOSTILE_FAULTS]), report.lines()


def test_p99_is_the_nearest_rank() -> None:
    assert p99([]) == 0.0
    assert p99([5.0]) == 5.0
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([float(i) for i in range(1, 201)]) == 198.0
