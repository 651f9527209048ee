"""`TimerProgress`: how far a master's timer store has durably got, copied to its slaves so that a
slave elected master does not deliver again every timer message the old master delivered
(RocketMQ `SlaveSynchronize.syncTimerCheckPoint`).

A master's value is its last timer checkpoint: `enqueue_queue_offset` (timer-topic units taken
in), `delivered_before_ms` (the open slot's start: every message enqueued before the mark and
due before this was delivered) and `commit_log_end` (the commit-log end when the checkpoint was
taken, which covers those deliveries). A slave keeps the last `KEPT` values it was sent and, once
elected, uses the newest whose `commit_log_end` its own log has reached (it has the deliveries
too): its timer enqueue skips the units below that mark due before that time. Units past the
mark, or due later, are enqueued as usual: a message may still be delivered twice (at least
once), never lost. Persisted as `config/timer_progress.json` (the newest mark), so a slave
restarted while its master is down still has it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from broker.persist import DirtyState

KEPT = 64
Mark = tuple[int, int, int]     # (enqueue_queue_offset, delivered_before_ms, commit_log_end)


class TimerProgress(DirtyState):
    """`saved()`: this broker's last checkpoint as a `Mark` (None before its first one)."""

    file_name = "timer_progress.json"

    def __init__(self, saved: Callable[[], Mark | None] = lambda: None) -> None:
        super().__init__()
        self.saved = saved
        self.copied: deque[Mark] = deque(maxlen=KEPT)

    def to_json(self) -> Any:
        marks = [mark for mark in (self.saved(), self.copied[-1] if self.copied else None) if mark is not None]
        mark = max(marks, key=lambda m: m[2], default=(0, 0, 0))       # the newest: its own, or its master's
        return {"enqueue_queue_offset": mark[0], "delivered_before_ms": mark[1], "commit_log_end": mark[2]}

    def load_json(self, value: Any) -> None:
        """A master's mark; raises `ValueError` unless three non-negative integers."""
        fields = ("enqueue_queue_offset", "delivered_before_ms", "commit_log_end")
        parts = [value.get(name) if isinstance(value, dict) else None for name in fields]
        if not all(type(part) is int and part >= 0 for part in parts):
            raise ValueError(f"timer progress must be three non-negative integers, got {value!r}")
        mark: Mark = (int(parts[0] or 0), int(parts[1] or 0), int(parts[2] or 0))
        if not self.copied or mark != self.copied[-1]:
            self.copied.append(mark)

    def usable(self, commit_log_end: int) -> tuple[int, int]:
        """(enqueue_queue_offset, delivered_before_ms) of the newest copied mark whose deliveries
        a log ending at `commit_log_end` holds; (0, 0) (skip nothing) when none."""
        for enqueue_queue_offset, delivered_before_ms, end in reversed(self.copied):
            if end <= commit_log_end:
                return enqueue_queue_offset, delivered_before_ms
        return 0, 0
