"""`TimerProgress` (the master's timer mark copied to slaves) and the enqueue's skip of what the
old master delivered, with no broker: a mark is used only once the log holds its deliveries, and
a skipped unit is exactly one below the mark's queue offset and due before its time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.timer.timer_progress import KEPT, TimerProgress
from broker.timer.timer_wheel_state import TimerState

PRECISION = 100
MAX_DELAY = 60_000
START = 1_700_000_000_000

marks = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**12), st.integers(0, 10**9)), max_size=100)


@given(marks, st.integers(0, 10**9))
def test_the_usable_mark_is_the_newest_whose_deliveries_the_log_holds(sent: list[tuple[int, int, int]],
                                                                     end: int) -> None:
    progress = TimerProgress()
    for enqueue_offset, before_ms, log_end in sent:
        progress.load_json({"enqueue_queue_offset": enqueue_offset, "delivered_before_ms": before_ms,
                            "commit_log_end": log_end})
    kept = [m for i, m in enumerate(sent) if i == 0 or m != sent[i - 1]][-KEPT:]
    eligible = [(offset, before) for offset, before, log_end in kept if log_end <= end]
    assert progress.usable(end) == (eligible[-1] if eligible else (0, 0))


@given(marks)
def test_a_slave_passes_on_the_newest_mark_it_knows(sent: list[tuple[int, int, int]]) -> None:
    """Its own checkpoint's (it was master before) or its master's, whichever covers more log."""
    own = (5, 500, 5_000)
    progress = TimerProgress(lambda: own)
    for enqueue_offset, before_ms, log_end in sent:
        progress.load_json({"enqueue_queue_offset": enqueue_offset, "delivered_before_ms": before_ms,
                            "commit_log_end": log_end})
    value = progress.to_json()
    newest = max([own, *sent[-1:]], key=lambda m: m[2])
    assert (value["enqueue_queue_offset"], value["delivered_before_ms"], value["commit_log_end"]) == newest
    again = TimerProgress()
    again.load_json(value)
    assert again.usable(newest[2]) == newest[:2]


@pytest.mark.parametrize("value", [None, [], {}, {"enqueue_queue_offset": -1, "delivered_before_ms": 0,
                                                  "commit_log_end": 0},
                                   {"enqueue_queue_offset": "1", "delivered_before_ms": 0, "commit_log_end": 0},
                                   {"enqueue_queue_offset": 1, "delivered_before_ms": 1.5, "commit_log_end": 0}])
def test_a_malformed_mark_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        TimerProgress().load_json(value)


@given(st.lists(st.integers(-2_000, 3_000), min_size=1, max_size=60), st.integers(0, 80), st.integers(-2_000, 3_000),
       st.integers(1, 20))
def test_the_enqueue_skips_exactly_what_the_old_master_delivered(dues: list[int], skip_below: int, skip_before: int,
                                                                 batch: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        state = TimerState(Path(directory), PRECISION, MAX_DELAY, START)
        state.delivered_by_master = (skip_below, START + skip_before)
        units = [(offset, 10, START + due) for offset, due in enumerate(dues)]
        handed: list[int] = []
        for first in range(0, len(units), batch):
            due_now, _ = state.enqueue(units[first:first + batch], START)
            handed += [offset for offset, _ in due_now]
        slots = {due // PRECISION for due in dues if due > 0}
        scheduled = sum(state.scheduled(START + PRECISION * slot).records for slot in slots)
        kept = [offset for offset, _, due_ms in units if not (offset < skip_below and due_ms < START + skip_before)]
        assert handed == [offset for offset in kept if units[offset][2] <= START]
        assert scheduled == len([offset for offset in kept if units[offset][2] > START])
        assert state.enqueue_queue_offset == len(units)
        state.close()
