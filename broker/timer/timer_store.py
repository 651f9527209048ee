"""`TimerMessageStore`: the timer store's services (RocketMQ 5 `TimerMessageStore`'s enqueue,
dequeue and flush threads, as three `Service`s over one `TimerState`).

- `TimerEnqueueService` tails consume queue 0 of `rmq_sys_wheel_timer` from the enqueue mark,
  woken by each arrival there (`on_arrival`); units already due are delivered at once.
- `TimerDequeueService` sleeps until the next slot opens or the next record of the open slot is
  due (not a poll: a timer to that instant, or a wake-up when the open slot gets a record) and
  delivers what is due.
- `TimerCheckpointService` every `CHECKPOINT_INTERVAL_MS`: takes both marks, fsyncs the commit log
  (the deliveries before the marks), the timer log and the wheel, then writes the marks and drops
  the timer log's prefix no slot from the saved dequeue mark on reaches (`TimerState.truncate`).
  After a crash both resume from the last marks: what was enqueued or delivered since is done
  again, so a message may be delivered twice, but none is lost, skipped or delivered before its time.

A record whose message is not due yet when it comes (a roll record, see `timer_wheel_state`) puts
the message back into the timer topic with TIMER_ROLL_TIMES + 1 instead of delivering it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from broker.store.message_store import MessageStore
from broker.store.put_due import put_due
from broker.timer.deliver_time import timer_due_of, without_timer_properties
from broker.timer.timer_wheel_state import TimerState
from protocol.message import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, PROPERTY_TIMER_ROLL_TIMES
from protocol.service import Service
from protocol.topics import TIMER_TOPIC

log = logging.getLogger(__name__)

UNITS_PER_READ = 4_096          # consume-queue units enqueued per step
MAX_DELIVERIES_PER_STEP = 4_096   # then a service yields so sends and pulls are served in between
MAX_SKIPS_PER_STEP = 100_000    # empty slots passed per step while catching up
RETRY_AFTER_FAILURE_MS = 100
DISK_RETRY_MS = 1_000           # the timer files could not be written (a full disk): retried this often
CHECKPOINT_INTERVAL_MS = 200
DRAIN_GRACE_MS = 2_000         # a stop waits this long (beyond the slot) for the open slot to finish
IDLE_WAIT_MS = 60_000           # the enqueue sleeps until an arrival; this is a safety net only
Lateness = Callable[[float], None]      # told each delivery's lateness, in seconds


def _roll_times(properties: dict[str, str]) -> int:
    try:
        return int(properties.get(PROPERTY_TIMER_ROLL_TIMES, "0"))
    except ValueError:
        return 0


class TimerEnqueueService(Service):
    name = "timer-enqueue"

    def __init__(self, state: TimerState, store: MessageStore, now_ms: Callable[[], int],
                 wake_dequeue: Callable[[], None]) -> None:
        super().__init__()
        self._state, self._store, self._now_ms, self._wake_dequeue = state, store, now_ms, wake_dequeue
        self.delivered_at_once = 0

    async def run(self) -> None:
        while True:
            wait_ms = self.step()
            if not await self.wait(wait_ms):
                return

    def step(self) -> int:
        """Enqueue one read of units; returns ms to wait (0: more to do)."""
        state, store = self._state, self._store
        min_offset = store.get_min_offset(TIMER_TOPIC, 0)
        if state.enqueue_queue_offset < min_offset:
            log.warning("timer: enqueue offset %d is below the timer queue's min %d (files cleaned); moving on",
                        state.enqueue_queue_offset, min_offset)
            state.enqueue_queue_offset = min_offset
        units = store.read_queue_units(TIMER_TOPIC, 0, state.enqueue_queue_offset, UNITS_PER_READ)
        if not units:
            return IDLE_WAIT_MS
        offset = state.enqueue_queue_offset
        try:
            due_now, wake = state.enqueue(units, self._now_ms())
        except OSError as exc:
            log.warning("timer: enqueue at queue offset %d failed (%s); retrying in %d ms", offset, exc,
                        DISK_RETRY_MS)
            return DISK_RETRY_MS
        if due_now and put_due(store, due_now, without_timer_properties, "timer") is None:
            state.enqueue_queue_offset = offset     # the wheel's records stay: a retry may add twins
            return RETRY_AFTER_FAILURE_MS
        self.delivered_at_once += len(due_now)
        state.delivered_total += len(due_now)
        if wake:
            self._wake_dequeue()
        return 0


class TimerDequeueService(Service):
    name = "timer-dequeue"

    def __init__(self, state: TimerState, store: MessageStore, now_ms: Callable[[], int],
                 on_lateness: Lateness | None = None) -> None:
        super().__init__()
        self._state, self._store, self._now_ms, self._on_lateness = state, store, now_ms, on_lateness
        self.delivered = 0
        self.rolled = 0
        self.drained = asyncio.Event()      # set once a draining cursor has closed its slot
        self._step_now_ms = 0
        self._step_rolled = 0

    def _route(self, properties: dict[str, str]) -> tuple[str, int, dict[str, str]]:
        """Where a due record's message goes: its real queue, or back into the timer topic (a
        roll) while its TIMER_OUT_MS is still ahead. Raises KeyError / ValueError (skipped)."""
        due_ms, now_ms = timer_due_of(properties), self._step_now_ms
        if due_ms > now_ms:
            self._step_rolled += 1
            return TIMER_TOPIC, 0, {**properties, PROPERTY_TIMER_ROLL_TIMES: str(_roll_times(properties) + 1)}
        topic, queue_id = properties[PROPERTY_REAL_TOPIC], int(properties[PROPERTY_REAL_QUEUE_ID])
        if self._on_lateness is not None:
            self._on_lateness((now_ms - due_ms) / 1000)
        return topic, queue_id, without_timer_properties(properties)

    async def run(self) -> None:
        while True:
            wait_ms = self.step()
            if not await self.wait(wait_ms):
                return

    def step(self) -> int:
        cursor = self._state.dequeue
        delivered = 0
        while delivered < MAX_DELIVERIES_PER_STEP:
            records, wait_ms = cursor.next_due(self._now_ms(), MAX_DELIVERIES_PER_STEP - delivered,
                                               MAX_SKIPS_PER_STEP)
            if not records:
                if cursor.draining and not cursor.opened:
                    self.drained.set()
                return wait_ms
            self._step_now_ms, self._step_rolled = self._now_ms(), 0
            if put_due(self._store, [(r.commit_log_offset, r.size) for r in records], without_timer_properties,
                       "timer", route=self._route) is None:
                return RETRY_AFTER_FAILURE_MS
            cursor.delivered(len(records))
            delivered += len(records)
            self.delivered += len(records) - self._step_rolled
            self.rolled += self._step_rolled
            self._state.delivered_total += len(records) - self._step_rolled
            self._state.rolled_total += self._step_rolled
        return 0


class TimerCheckpointService(Service):
    name = "timer-checkpoint"

    def __init__(self, state: TimerState, store: MessageStore, delivered: Callable[[], int]) -> None:
        super().__init__()
        self._state, self._store, self._delivered = state, store, delivered
        self._saved: tuple[int, int] | None = None
        self._saved_delivered = 0
        self.saved_mark: tuple[int, int, int] | None = None     # (enqueue offset, slot start ms, log end)

    async def run(self) -> None:
        while await self.wait(CHECKPOINT_INTERVAL_MS):
            try:
                await self.checkpoint(force=False)
            except OSError as exc:      # a full disk: the last checkpoint stands; tried again
                log.warning("timer: checkpoint failed (%s); retrying", exc)

    async def checkpoint(self, *, force: bool) -> None:
        """Save the marks as they are now once what they cover is durable; raises `OSError`.
        Unless `force`d (a stop), only after messages were enqueued or delivered: passing empty
        slots alone is cheap to redo after a crash, and an idle broker writes nothing."""
        progress, delivered = self._state.progress(), self._delivered()
        if progress == self._saved:
            return
        if not force and self._saved is not None and progress[0] == self._saved[0] \
                and delivered == self._saved_delivered:
            if self.saved_mark is not None:     # only empty slots passed: the mark moves (nothing to flush)
                self.saved_mark = (progress[0], progress[1] * self._state.precision_ms, self.saved_mark[2])
            return
        end = self._store.commit_log_max_offset()       # covers the deliveries `progress` counts
        await self._store.flush()
        await asyncio.to_thread(self._state.save, progress)
        self._saved, self._saved_delivered = progress, delivered
        self.saved_mark = (progress[0], progress[1] * self._state.precision_ms, end)


class TimerMessageStore:
    """The timer store of one broker: files in `<store>/timer/`. `start()` after the message
    store has started, `stop()` before it stops (a last checkpoint is written). Raises what
    `TimerState` raises on start."""

    def __init__(self, store: MessageStore, directory: Path, *, precision_ms: int, max_delay_ms: int,
                 now_ms: Callable[[], int], roll_window_ms: int | None = None,
                 on_lateness: Lateness | None = None) -> None:
        self.state = TimerState(directory, precision_ms, max_delay_ms, now_ms(), roll_window_ms)
        self.max_delay_ms = max_delay_ms
        self._store = store
        self.dequeue = TimerDequeueService(self.state, store, now_ms, on_lateness)
        self.enqueue = TimerEnqueueService(self.state, store, now_ms, self.dequeue.wakeup)
        self.checkpointer = TimerCheckpointService(self.state, store, lambda: self.delivered + self.dequeue.rolled)

    async def start(self) -> None:
        await self.enqueue.start()
        await self.dequeue.start()
        await self.checkpointer.start()

    async def stop(self) -> None:
        """Let the dequeue finish the slot it has open (at most `precision_ms` + `DRAIN_GRACE_MS`:
        what it leaves is delivered again after the restart), stop the services, checkpoint."""
        cursor = self.state.dequeue
        cursor.set_draining()
        self.dequeue.wakeup()
        if cursor.opened:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout((self.state.precision_ms + DRAIN_GRACE_MS) / 1000):
                    await self.dequeue.drained.wait()
        await self.checkpointer.stop()
        await self.dequeue.stop()
        await self.enqueue.stop()
        try:
            await self.checkpointer.checkpoint(force=True)
        except OSError:
            log.exception("timer: the last checkpoint could not be written; the next start redoes work")
        self.state.close()

    def on_arrival(self) -> None:
        """A message reached the timer topic's consume queue."""
        self.enqueue.wakeup()

    @property
    def delivered(self) -> int:
        """Messages delivered to their real queue by this run (rolls not counted)."""
        return self.dequeue.delivered + self.enqueue.delivered_at_once

    @property
    def enqueued(self) -> int:
        """Timer-topic units the enqueue took in (this run)."""
        return self.state.enqueued

    @property
    def rolled(self) -> int:
        """Messages rolled: put back into the timer topic, not yet due (this run)."""
        return self.dequeue.rolled

    @property
    def scheduled(self) -> int:
        """Timer messages stored and not yet delivered (RocketMQ's timer backlog): the timer
        topic's units less those delivered or rolled (a rolled message counts once, as its new
        unit); counts kept across restarts by the checkpoint, so after a crash it may be low by
        the deliveries repeated."""
        units = self._store.get_max_offset(TIMER_TOPIC, 0)
        return max(0, units - self.state.delivered_total - self.state.rolled_total)
