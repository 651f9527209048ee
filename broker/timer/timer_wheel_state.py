"""`TimerState`: the timer log, the wheel and the two progress marks (enqueue: queue offset in
`rmq_sys_wheel_timer`; dequeue: the slot being delivered), with the synchronous steps the
services run (RocketMQ 5 `TimerMessageStore`'s enqueue and dequeue, RIP-43). No clock reads:
`now_ms` is passed in.

Enqueue (`enqueue`): each consume-queue unit of the timer topic carries its message's due time in
place of the tags code; a unit already due is handed back to be delivered at once, any other
becomes a timer-log record linked to the head of its slot's chain (records of one batch written
with one `os.write`, then the wheel's slots updated). Dequeue (`DequeueCursor`): slot `n` opens
at `n * precision_ms`; its chain is read newest to oldest `CHUNK` records at a time, each chunk
sorted by due time and delivered record by record as each comes due (never before); records
appended to the open slot meanwhile are read after (their positions are above the head the walk
began from); the slot closes once read, delivered and its time is over. Memory: a chunk of
records, whatever the number scheduled.

Roll (RocketMQ 5's `timerRollWindowSlots`): a unit due more than `roll_window_ms` after the
enqueue's `now_ms` gets a record due at `now_ms + roll_window_ms` instead; when that comes, the
dequeue finds the message not yet due and puts it into the timer topic again (TIMER_ROLL_TIMES + 1),
so its body lives in a newer commit-log file than retention deletes. Every record is thus due at
most `roll_window_ms` after it was appended, which bounds the log's live part: `truncate` drops the
prefix appended before a mark whose bound the checkpointed dequeue slot has passed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from broker.persist import read_json, write_json_atomic
from broker.timer.layout import NO_POS, RECORD_SIZE, Slot, TimerRecord, encode_record, link, slot_of, slots_total
from broker.timer.timer_files import TimerLog, TimerWheel

log = logging.getLogger(__name__)

CHUNK = 4_096                 # records of a chain read at a time (and the most held in memory)
CHECKPOINT_FILE = "timercheck.json"
MARKS_MAX = 256               # truncation marks kept; past it every other one goes (later, coarser drops)


class TimerState:
    """Files under `directory`: `timerlog`, `timerwheel`, `timercheck.json` (the last checkpoint:
    `{"enqueue_queue_offset": n, "dequeue_slot": n, "delivered": n, "rolled": n}`, written
    atomically). A fresh store starts dequeuing at the slot of `now_ms`. `roll_window_ms`: see the
    module doc (None: `max_delay_ms`, no roll). Raises `ValueError` for a wheel of another size or a
    checkpoint that is not two non-negative integers, `OSError` from the file system."""

    def __init__(self, directory: Path, precision_ms: int, max_delay_ms: int, now_ms: int,
                 roll_window_ms: int | None = None) -> None:
        self.precision_ms = precision_ms
        self.directory = directory
        self.roll_window_ms = max_delay_ms if roll_window_ms is None else max(precision_ms, roll_window_ms)
        self.log = TimerLog(directory / "timerlog")
        self.wheel = TimerWheel(directory / "timerwheel", slots_total(max_delay_ms, precision_ms))
        saved: Any = read_json(directory / CHECKPOINT_FILE) or {}
        enqueue = saved.get("enqueue_queue_offset", 0)
        dequeue = saved.get("dequeue_slot", slot_of(now_ms, precision_ms))
        if type(enqueue) is not int or type(dequeue) is not int or enqueue < 0 or dequeue < 0:
            raise ValueError(f"{directory / CHECKPOINT_FILE}: progress must be two non-negative integers, "
                             f"got {saved!r}")
        self.enqueue_queue_offset = enqueue
        self.dequeue = DequeueCursor(self, dequeue)
        self.delivered_total = int(saved.get("delivered", 0) or 0)     # as of the checkpoint, then counted on
        self.rolled_total = int(saved.get("rolled", 0) or 0)
        self.enqueued = 0             # units enqueued by this run
        # (queue offset, due ms): units below the offset due before the time were delivered by the
        # master this broker took over from (`TimerProgress`): skipped, not delivered again
        self.delivered_by_master = (0, 0)
        # (log position, due bound): every record below the position is due by the bound (epoch ms);
        # what was appended before this start may be due as late as `max_delay_ms` from now (an
        # earlier run's roll window is not known), so a restart drops nothing for that long
        start_bound = now_ms + max(max_delay_ms, self.roll_window_ms) if self.log.size else now_ms
        self._marks: list[tuple[int, int]] = [(self.log.size, start_bound)]

    # -- enqueue --------------------------------------------------------------------------------

    def enqueue(self, units: list[tuple[int, int, int]], now_ms: int) -> tuple[list[tuple[int, int]], bool]:
        """Add consume-queue units `(commit_log_offset, size, due_ms)` (the next ones from
        `enqueue_queue_offset`) to the log and the wheel. Returns the units already due (to be
        delivered at once by the caller) and whether the dequeue's open slot got records (wake
        it). The log is written before the wheel: a crash in between leaves records no slot
        reaches, and the units are enqueued again from the last checkpoint. Raises `OSError` (a
        full disk) with nothing written and `enqueue_queue_offset` unchanged."""
        precision, current, roll_at = self.precision_ms, self.dequeue.slot, now_ms + self.roll_window_ms
        due_now: list[tuple[int, int]] = []
        heads: dict[int, Slot] = {}
        records = bytearray()
        pos = self.log.size
        wheel_get = self.wheel.get
        skip_below, skip_due_before = self.delivered_by_master
        skip_count = max(0, min(skip_below - self.enqueue_queue_offset, len(units)))
        for index, (commit_log_offset, size, due_ms) in enumerate(units):
            if index < skip_count and due_ms < skip_due_before:
                continue
            if due_ms <= now_ms:
                due_now.append((commit_log_offset, size))
                continue
            if due_ms > roll_at:
                due_ms = roll_at        # then rolled by the dequeue (the message keeps its TIMER_OUT_MS)
            slot = max(slot_of(due_ms, precision), current)
            head = heads.get(slot)
            if head is None:
                head = wheel_get(slot)
            records += encode_record(head.head_pos, commit_log_offset, due_ms, size)
            heads[slot] = link(head, pos)
            pos += RECORD_SIZE
        if records:             # nothing is written when the disk refuses (OSError)
            self.wheel.reserve(heads)
            self.log.append(bytes(records))
            for slot, value in heads.items():
                self.wheel.put(slot, value)
            self._mark(max(roll_at, max(heads) * precision))    # (a dequeue ahead of the clock)
        self.enqueue_queue_offset += len(units)
        self.enqueued += len(units)
        return due_now, current in heads and self.dequeue.opened

    # -- checkpoint -------------------------------------------------------------------------------

    def _mark(self, bound_ms: int) -> None:
        """Every record appended so far is due by `bound_ms` (or by an earlier mark's bound)."""
        marks = self._marks
        last_bound = marks[-1][1]
        bound_ms = max(bound_ms, last_bound)
        if bound_ms - last_bound < self.roll_window_ms // 64 and len(marks) > 1:
            marks[-1] = (self.log.size, bound_ms)
            return
        marks.append((self.log.size, bound_ms))
        if len(marks) > MARKS_MAX:
            del marks[1:-1:2]

    def progress(self) -> tuple[int, int]:
        """(enqueue_queue_offset, dequeue_slot) as a checkpoint would save them now."""
        return self.enqueue_queue_offset, self.dequeue.slot

    def save(self, progress: tuple[int, int]) -> int:
        """fsync the log, msync the wheel, then write `progress` atomically (the caller made sure
        the deliveries it covers are durable in the commit log), then `truncate` to it. Returns
        the timer-log bytes dropped."""
        self.log.flush()
        self.wheel.flush()
        write_json_atomic(self.directory / CHECKPOINT_FILE,
                          {"enqueue_queue_offset": progress[0], "dequeue_slot": progress[1],
                           "delivered": self.delivered_total, "rolled": self.rolled_total})
        return self.truncate(progress[1])

    def truncate(self, saved_dequeue_slot: int) -> int:
        """Drop the timer log's prefix that no slot from `saved_dequeue_slot` on can reach (the
        records of a mark whose bound lies in an earlier slot: delivered, or rolled into newer
        records), so a restart from that checkpoint never reads it. Returns the bytes dropped."""
        marks, precision = self._marks, self.precision_ms
        drop_to = 0
        while len(marks) > 1 and slot_of(marks[0][1], precision) < saved_dequeue_slot:
            drop_to = marks.pop(0)[0]
        if slot_of(marks[0][1], precision) < saved_dequeue_slot:
            drop_to = marks[0][0]
        return self.log.drop_before(drop_to) if drop_to else 0

    def scheduled(self, deliver_ms: int) -> Slot:
        """The wheel's slot holding `deliver_ms` (for tests and the admin view)."""
        return self.wheel.get(slot_of(deliver_ms, self.precision_ms))

    def close(self) -> None:
        self.log.close()
        self.wheel.close()


class DequeueCursor:
    """Where the dequeue is: `slot` (the slot being delivered or next to open), whether it is
    `opened`, the chain walk (`walk_from` down to above `stop_at`, `seen_head` the newest record
    read) and `batch`, the chunk read and not yet delivered, sorted by due time."""

    def __init__(self, state: TimerState, slot: int) -> None:
        self._state = state
        self.slot = slot
        self.opened = False
        self.walk_from = self.stop_at = self.seen_head = NO_POS
        self.batch: list[TimerRecord] = []
        self.draining = False       # stopping: finish the open slot, open no other

    def set_draining(self) -> None:
        """Open no further slot (a clean stop finishes the open one first, so the checkpoint
        after it repeats nothing)."""
        self.draining = True

    def next_due(self, now_ms: int, max_records: int, max_skips: int) -> tuple[list[TimerRecord], int]:
        """Advance the cursor; returns (records due now, to deliver: at most `max_records`, and
        take them out of `batch` with `delivered`) and the ms to wait after delivering them
        (0: call again at once)."""
        state = self._state
        precision = state.precision_ms
        now_slot = slot_of(now_ms, precision)
        skips = 0
        while True:
            if not self.opened:
                if self.draining:
                    return [], 60_000
                if self.slot > now_slot:
                    return [], self.slot * precision - now_ms
                head = state.wheel.get(self.slot)
                if head.records == 0:
                    self.slot += 1
                    skips += 1
                    if skips >= max_skips:
                        return [], 0
                    continue
                self.opened = True
                self.seen_head = self.walk_from = head.head_pos
                self.stop_at = NO_POS
            if self.walk_from == NO_POS:        # the chain is read: newcomers since?
                head_pos = state.wheel.get(self.slot).head_pos
                if head_pos > self.seen_head:
                    self.stop_at, self.seen_head, self.walk_from = self.seen_head, head_pos, head_pos
            if self.walk_from != NO_POS and len(self.batch) <= CHUNK // 2:
                self._read_chunk()
                continue
            batch = self.batch
            if batch:
                count = 0
                while count < len(batch) and count < max_records and batch[count].deliver_ms <= now_ms:
                    count += 1
                if count:
                    return batch[:count], 0
                return [], batch[0].deliver_ms - now_ms
            if now_slot <= self.slot:          # read and delivered, but its time is not over yet
                return [], (self.slot + 1) * precision - now_ms
            self.slot += 1
            self.opened = False

    def delivered(self, count: int) -> None:
        del self.batch[:count]

    def _read_chunk(self) -> None:
        read = self._state.log.read
        chunk: list[TimerRecord] = []
        pos = self.walk_from
        limit = CHUNK - len(self.batch)
        while pos != NO_POS and pos > self.stop_at and len(chunk) < limit:
            record = read(pos)
            if record is None:
                log.error("timer: slot %d: the chain breaks at log position %d (not a valid record); "
                          "its older records are skipped", self.slot, pos)
                pos = NO_POS
                break
            chunk.append(record)
            pos = record.prev_pos
        self.walk_from = pos if pos > self.stop_at else NO_POS
        self.batch = sorted(self.batch + chunk, key=lambda record: record.deliver_ms)
