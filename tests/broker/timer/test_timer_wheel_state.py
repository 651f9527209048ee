"""Property tests of the timer log and wheel (`TimerState`, `DequeueCursor`) with no broker: every
enqueued unit is handed out once, never before its due time, in due-time order within a chunk;
a crash at any point followed by a replay from the last checkpoint loses and advances nothing."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.timer.layout import (
    EMPTY_SLOT,
    NO_POS,
    Slot,
    decode_record,
    decode_slot,
    encode_record,
    encode_slot,
    link,
    slot_index,
    slot_of,
    slots_total,
)
from broker.timer.timer_wheel_state import TimerState
from tests.broker.test_disk_full import fill, small_disk

PRECISION = 100
MAX_DELAY = 60_000
START = 1_700_000_000_000


@given(st.integers(0, 2**62), st.integers(1, 1_000))
def test_a_slot_holds_times_from_its_start_to_before_the_next(deliver_ms: int, precision: int) -> None:
    slot = slot_of(deliver_ms, precision)
    assert slot * precision <= deliver_ms < (slot + 1) * precision


@given(st.integers(1, 10**9), st.integers(1, 1_000), st.integers(0, 2**40))
def test_live_slots_never_share_an_index(max_delay_ms: int, precision: int, first: int) -> None:
    total = slots_total(max_delay_ms, precision)
    live = range(first, first + -(-max_delay_ms // precision) + 1)      # the dequeue's slot .. now + max
    if len(live) <= 10_000:
        assert len({slot_index(s, total) for s in live}) == len(live)
    assert total >= 2 * (len(live) - 1)


@given(st.integers(-1, 2**40), st.integers(0, 2**40), st.integers(0, 2**62), st.integers(1, 2**31 - 1))
def test_records_round_trip_and_any_flipped_byte_is_caught(prev: int, offset: int, due: int, size: int) -> None:
    pos = max(prev + 32, 0)
    data = encode_record(prev, offset, due, size)
    record = decode_record(data, 0, pos)
    assert record is not None and (record.prev_pos, record.commit_log_offset, record.deliver_ms,
                                   record.size) == (prev, offset, due, size)
    for index in (0, 9, 20, 27, 30):
        broken = bytearray(data)
        broken[index] ^= 0x40
        assert decode_record(bytes(broken), 0, pos) is None


@given(st.integers(0, 2**40), st.integers(0, 2**40), st.integers(1, 1000))
def test_slots_round_trip_and_a_slot_of_another_round_reads_empty(slot: int, head: int, count: int) -> None:
    value = Slot(head, 0, count)
    data = encode_slot(slot, value)
    assert decode_slot(data, 0, slot) == value
    assert decode_slot(data, 0, slot + 1) is EMPTY_SLOT
    assert link(EMPTY_SLOT, 64) == Slot(64, 64, 1) and link(value, head + 32) == Slot(head + 32, 0, count + 1)


Op = tuple[str, int]
ops = st.lists(st.one_of(
    st.tuples(st.just("send"), st.integers(-500, MAX_DELAY)),      # a unit due this many ms from now
    st.tuples(st.just("tick"), st.integers(0, 3_000)),              # time passes by this many ms
    st.tuples(st.just("deliver"), st.integers(1, 50)),              # the dequeue hands out up to n
    st.tuples(st.just("checkpoint"), st.just(0)),
    st.tuples(st.just("crash"), st.just(0)),                         # reopen from the files and the last checkpoint
), max_size=120)


class Model:
    """The timer store as the services drive it, with a consume queue kept in a list."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.now = directory, START
        self.queue: list[tuple[int, int, int]] = []          # (commit_log_offset, size, due)
        self.delivered: Counter[int] = Counter()
        self.state = self._open()

    def _open(self) -> TimerState:
        return TimerState(self.directory, PRECISION, MAX_DELAY, self.now)

    def enqueue_all(self) -> None:
        state = self.state
        while state.enqueue_queue_offset < len(self.queue):
            units = self.queue[state.enqueue_queue_offset:state.enqueue_queue_offset + 7]
            due_now, _ = state.enqueue(units, self.now)
            for offset, _size in due_now:
                self.hand_out(offset)

    def hand_out(self, offset: int) -> None:
        assert self.queue[offset][2] <= self.now, "delivered before its time"
        self.delivered[offset] += 1

    def deliver(self, limit: int) -> None:
        cursor = self.state.dequeue
        while limit > 0:
            records, _wait = cursor.next_due(self.now, limit, 1_000_000)
            if not records:
                return
            assert [r.deliver_ms for r in records] == sorted(r.deliver_ms for r in records)
            for record in records:
                self.hand_out(record.commit_log_offset)
            cursor.delivered(len(records))
            limit -= len(records)

    def apply(self, op: Op) -> None:
        kind, value = op
        if kind == "send":
            self.queue.append((len(self.queue), 100, self.now + value))
            self.enqueue_all()
        elif kind == "tick":
            self.now += value
        elif kind == "deliver":
            self.deliver(value)
        elif kind == "checkpoint":
            self.state.save(self.state.progress())
        else:
            self.state.close()
            self.state = self._open()
            self.enqueue_all()


@settings(max_examples=150, deadline=None)
@given(ops)
def test_every_unit_is_handed_out_once_at_or_after_its_time_across_crashes(script: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        model = Model(Path(directory))
        crashed = False
        for op in script:
            crashed |= op[0] == "crash"
            model.apply(op)
        model.now += MAX_DELAY + 1_000
        model.deliver(10**9)
        assert set(model.delivered) == set(range(len(model.queue))), "a unit was lost"
        if not crashed:
            assert max(model.delivered.values(), default=1) == 1, "a unit handed out twice without a crash"
        model.state.close()


def test_a_big_slot_is_read_a_chunk_at_a_time(tmp_path: Path) -> None:
    state = TimerState(tmp_path, PRECISION, MAX_DELAY, START)
    due = START + 1_050
    for first in range(0, 20_000, 4_096):
        state.enqueue([(i, 10, due) for i in range(first, min(first + 4_096, 20_000))], START)
    assert state.scheduled(due).records == 20_000
    cursor = state.dequeue
    assert cursor.next_due(START + 1_000, 10**9, 10**9) == ([], 50)       # the slot opened, its records not due
    assert len(cursor.batch) == 4_096                                        # one chunk held, not 20,000
    handed: list[int] = []
    while True:
        records, _ = cursor.next_due(due, 1_000, 10**9)
        if not records:
            break
        handed += [r.commit_log_offset for r in records]
        cursor.delivered(len(records))
        assert len(cursor.batch) <= 4_096
    assert sorted(handed) == list(range(20_000))
    assert cursor.walk_from == NO_POS
    state.close()


def test_a_full_disk_refuses_an_enqueue_with_nothing_written_and_holes_read_as_empty(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 4 << 20) as disk:
        state = TimerState(disk / "timer", PRECISION, 3 * 86_400_000, START)      # a 166 MB sparse wheel
        state.enqueue([(0, 10, START + 5_000)], START)
        fill(disk, 0)
        with pytest.raises(OSError):
            state.enqueue([(1, 10, START + 86_400_000)], START)      # a slot in a page never written
        assert state.enqueue_queue_offset == 1 and state.log.size == 32
        assert state.scheduled(START + 86_400_000) is EMPTY_SLOT    # a hole is read without a fault
        assert state.scheduled(START + 5_000).records == 1
        state.close()
        reopened = TimerState(disk / "timer", PRECISION, 3 * 86_400_000, START)
        assert reopened.scheduled(START + 5_000).records == 1
        reopened.close()
