"""`ScheduleService`: delivers delayed messages from `SCHEDULE_TOPIC_XXXX` to their real topic and
queue when due (RocketMQ `ScheduleMessageService`, REFERENCE.md §10).

One `LevelDelivery` service per delay level walks that level's queue (`level - 1`) in queue-offset
order, which is store-timestamp order, so within a level the due times never decrease. It never
polls: when the head message is not yet due it sleeps exactly until it is; when the queue is
drained it sleeps until the store reports an arrival on that queue (`on_arrival`).

Delivery offsets (`offset_table`: level -> next queue offset to deliver) persist as strict JSON in
`<store>/config/delay_offsets.json` through the broker's `ConfigPersistService` (atomic writes). A
persisted offset never runs ahead of what is on disk: an offset is written only once the commit log
is flushed past the messages it delivered, so after a crash a due message can be delivered twice
(an at-least-once duplicate, as in RocketMQ) but never skipped.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

from broker.persist import DirtyState
from broker.schedule.delay_levels import countdown_ms, level_of, queue_id_of
from broker.store.message_store import MessageStore
from broker.store.put_due import put_due
from protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
)
from protocol.service import Service
from protocol.topics import SCHEDULE_TOPIC

log = logging.getLogger(__name__)

IDLE_WAIT_MS = 60_000          # a drained level sleeps until an arrival; this is only a safety net
RETRY_AFTER_FAILURE_MS = 100   # DELAY_FOR_A_WHILE: a failed put is retried at the same offset
UNITS_PER_READ = 1_024         # consume-queue units read at a time
MAX_DELIVERIES_PER_STEP = 1_024   # then the loop yields so sends and pulls are served in between


class DelayOffsets(DirtyState):
    """level -> next queue offset to deliver; persisted as `{"offset_table": {"1": n, ...}}`.

    `advance` records a delivery with the commit-log end of the message it wrote; `to_json` writes
    for each level only the offset whose deliveries are all below `flushed_offset()`."""

    file_name = "delay_offsets.json"

    def __init__(self, flushed_offset: Callable[[], int] = lambda: 0) -> None:
        super().__init__()
        self.offset_table: dict[int, int] = {}
        self._durable: dict[int, int] = {}
        self._pending: dict[int, collections.deque[tuple[int, int]]] = {}
        self.flushed_offset = flushed_offset      # the store's, bound once the store exists

    def get(self, level: int) -> int:
        return self.offset_table.get(level, 0)

    def advance(self, level: int, next_queue_offset: int, commit_log_end_offset: int) -> None:
        self.offset_table[level] = next_queue_offset
        self._pending.setdefault(level, collections.deque()).append((next_queue_offset, commit_log_end_offset))
        self.touch()

    def skip_to(self, level: int, queue_offset: int) -> None:
        """Move without a delivery (the queue's min moved past the offset): durable at once."""
        self.offset_table[level] = self._durable[level] = queue_offset
        self._pending.pop(level, None)
        self.touch()

    @property
    def dirty(self) -> bool:
        return self._dirty or any(self._pending.values())

    def to_json(self) -> Any:
        flushed = self.flushed_offset()
        for level, pending in self._pending.items():
            while pending and pending[0][1] <= flushed:
                self._durable[level] = pending.popleft()[0]
        return {"offset_table": {str(level): offset for level, offset in sorted(self._durable.items())}}

    def mark_clean(self) -> None:
        self._dirty = False

    def load_json(self, value: Any) -> None:
        table = value.get("offset_table", {}) if isinstance(value, dict) else {}
        for level, offset in table.items():
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(f"delay offset of level {level!r} must be a non-negative integer")
            self.offset_table[int(level)] = self._durable[int(level)] = offset


class LevelDelivery(Service):
    """Delivers one level's due messages; see the module docstring."""

    def __init__(self, level: int, store: MessageStore, offsets: DelayOffsets, now_ms: Callable[[], int]) -> None:
        super().__init__()
        self.name = f"schedule-level-{level}"
        self.level, self._queue_id = level, queue_id_of(level)
        self._store, self._offsets, self._now_ms = store, offsets, now_ms
        self.idle = False
        self.delivered = 0

    async def run(self) -> None:
        while True:
            wait_ms = self._deliver_due()
            self.idle = wait_ms is None
            if not await self.wait(IDLE_WAIT_MS if wait_ms is None else wait_ms):
                return

    @property
    def backlog(self) -> int:
        return max(self._store.get_max_offset(SCHEDULE_TOPIC, self._queue_id) - self._offsets.get(self.level), 0)

    def _deliver_due(self) -> int | None:
        """Deliver what is due (at most `MAX_DELIVERIES_PER_STEP`); returns ms to wait: until the
        head is due, 0 to go on at once, `RETRY_AFTER_FAILURE_MS` after a failed put, None when the
        queue is drained."""
        store, level, queue_id = self._store, self.level, self._queue_id
        queue_offset = self._offsets.get(level)
        min_offset = store.get_min_offset(SCHEDULE_TOPIC, queue_id)
        if queue_offset < min_offset:
            log.warning("schedule level %d: offset %d is below the queue's min %d; moving on",
                        level, queue_offset, min_offset)
            queue_offset = min_offset
            self._offsets.skip_to(level, queue_offset)
        delivered = 0
        levels = store.delay_levels
        while delivered < MAX_DELIVERIES_PER_STEP:
            units = store.read_queue_units(SCHEDULE_TOPIC, queue_id, queue_offset, UNITS_PER_READ)
            if not units:
                return None
            now = self._now_ms()
            due = 0
            wait_ms = 0
            for _, _, deliver_at in units:
                wait_ms = countdown_ms(deliver_at, now, level, levels)
                if wait_ms > 0 or due >= MAX_DELIVERIES_PER_STEP - delivered:
                    break
                due += 1
            if due:
                end_offset = self._deliver(units[:due])
                if end_offset is None:
                    return RETRY_AFTER_FAILURE_MS
                queue_offset += due
                self._offsets.advance(level, queue_offset, end_offset)
                delivered += due
            if wait_ms > 0:
                return wait_ms
        return 0

    def _deliver(self, units: list[tuple[int, int, int]]) -> int | None:
        """Put the due messages of `units` to their real topics and queues (`put_due`: one append
        per run bound for the same queue, store order kept within each queue; None when a put
        failed and the whole run must be retried, at least once). The DELAY level is removed;
        REAL_TOPIC / REAL_QID stay, as RocketMQ."""
        def delivered(count: int) -> None:
            self.delivered += count
        return put_due(self._store, [(offset, size) for offset, size, _ in units], _without_delay_level,
                       f"schedule level {self.level}", delivered)


def _without_delay_level(properties: dict[str, str]) -> dict[str, str]:
    properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    return properties


class ScheduleService:
    """Owns one `LevelDelivery` per level of `store.delay_levels` and the shared `DelayOffsets`.
    `start()` after the store has started; `stop()` before it stops."""

    def __init__(self, store: MessageStore, offsets: DelayOffsets, now_ms: Callable[[], int]) -> None:
        self._store, self.offsets = store, offsets
        self.levels = [LevelDelivery(level, store, offsets, now_ms)
                       for level in range(1, len(store.delay_levels) + 1)]

    async def start(self) -> None:
        for level in self.levels:
            await level.start()

    async def stop(self) -> None:
        for level in reversed(self.levels):
            await level.stop()

    def on_arrival(self, topic: str, queue_id: int) -> None:
        """The store dispatched a message to `topic`:`queue_id`: wake that level if it is drained
        (a level waiting for its head to be due has nothing to gain: the newcomer is due later)."""
        if topic != SCHEDULE_TOPIC:
            return
        index = level_of(queue_id) - 1
        if 0 <= index < len(self.levels) and self.levels[index].idle:
            self.levels[index].idle = False
            self.levels[index].wakeup()

    def backlog(self, level: int) -> int:
        """Messages of `level` stored but not yet delivered (due or not)."""
        return self.levels[level - 1].backlog

    @property
    def delivered(self) -> int:
        return sum(level.delivered for level in self.levels)
