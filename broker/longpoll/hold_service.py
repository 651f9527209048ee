"""`HoldService`: pulls that found nothing wait here for a matching message (long polling, §3).

A held pull is a `HeldPull` registered under its (topic, queue_id) with its own deadline, so it
is answered on time without a scan (PROTOCOL.md deliberate difference 5: within 100 ms of it).
Deadlines are kept in 10 ms buckets, one loop timer per bucket: a pull answered early leaves its
bucket with a dict deletion, and the timer is cancelled only when the bucket empties (a timer per
pull, created at the hold and cancelled at the wake, was 15 % of waking 10,000 held pulls). A
pull is answered at the end of its bucket: not before its deadline, at most 10 ms after. The reput
step calls `notify_message_arriving` after dispatching each message; the pulls whose filter matches
are taken out and handed, in one batch, to their `PullResponder`, which answers them right there,
in the loop step of the arrival (no task wakes up per pull, and pulls waiting at the same place
share one read). At the deadline, at a stop, or from the sweep, pulls are answered the same way.

No lost wake-ups: `hold` is synchronous, so nothing can arrive between the pull's read and its
registration; the caller reads, finds nothing, and registers in one loop step.
A safety sweep every `check_interval_ms` wakes pulls whose queue has grown; correctness never
depends on it. Unlike RocketMQ's periodic scan, which ignores the filter, the sweep asks
`has_match` (when given) whether a filtered pull would find a matching message now, so a held
pull with a filter is never answered because non-matching messages arrived."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Protocol

from broker.filter.message_filter import MessageFilter
from protocol.service import Service

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
DEADLINE_TICK_S = 0.01
"""Held pulls' deadlines are rounded up to this (seconds): the pulls of one tick share a timer."""
HasMatch = Callable[[str, int, int, MessageFilter], bool]
"""`has_match(topic, queue_id, queue_offset, message_filter)`: would a read find a match now?"""


class PullResponder(Protocol):
    def answer(self, pulls: list[HeldPull], woken: bool) -> None:
        """Answer every pull of `pulls` (all of one (topic, queue_id)) now, exactly once; `woken` is
        False at the deadline or a stop. Must not raise: a failure is answered as an error."""


class HeldPull:
    """One held pull: where it waits, its filter, and who answers it. Owners (the pull processor)
    subclass it to carry the request being answered."""

    __slots__ = ("deadline_tick", "message_filter", "queue_id", "queue_offset", "responder", "topic",
                 "wake_on_arrival")

    def __init__(self, topic: str, queue_id: int, queue_offset: int, message_filter: MessageFilter | None,
                 responder: PullResponder) -> None:
        self.topic, self.queue_id, self.queue_offset = topic, queue_id, queue_offset
        self.message_filter, self.responder = message_filter, responder
        self.wake_on_arrival = True
        self.deadline_tick: int | None = None      # its bucket in `HoldService._due` while held


class _Due:
    """The held pulls whose deadline falls in one tick, and the timer that expires them."""

    __slots__ = ("pulls", "timer")

    def __init__(self, timer: asyncio.TimerHandle) -> None:
        self.pulls: dict[HeldPull, None] = {}
        self.timer = timer


class _SweepService(Service):
    name = "hold-sweep"

    def __init__(self, sweep: Callable[[], int], interval_ms: int) -> None:
        super().__init__()
        self._sweep, self._interval_ms = sweep, interval_ms

    async def run(self) -> None:
        while await self.wait(self._interval_ms):
            self._sweep()


class HoldService:
    """Held pulls by (topic, queue_id); `start`/`stop` run the safety sweep."""

    def __init__(self, get_max_offset: Callable[[str, int], int], check_interval_ms: int,
                 has_match: HasMatch | None = None) -> None:
        self._sweeper = _SweepService(self.sweep, check_interval_ms)
        self._get_max_offset = get_max_offset
        self._has_match = has_match
        self.held: dict[QueueKey, dict[HeldPull, None]] = {}
        self._due: dict[int, _Due] = {}         # deadline tick -> the pulls due then
        self._released = False
        # the loop, looked up at start: asyncio.get_running_loop() is a getpid syscall on CPython
        # 3.11 (its fork check), which every held pull would pay
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def held_count(self) -> int:
        return sum(len(pulls) for pulls in self.held.values())

    @property
    def deadline_timers(self) -> int:
        """How many deadline timers are armed: one per 10 ms tick that holds a pull's deadline."""
        return len(self._due)

    def hold(self, pull: HeldPull, timeout_ms: int, *, wake_on_arrival: bool = True) -> bool:
        """Hold `pull` until a message past its `queue_offset` that passes its filter arrives on its
        queue, or for `timeout_ms`; then its responder answers it (`woken` True or False).
        `wake_on_arrival=False` is short polling: only the deadline or a stop ends it. Returns
        False, holding nothing, when the broker is stopping or `timeout_ms` is not positive (the
        caller answers at once). Must be called from the event loop."""
        if self._released or timeout_ms <= 0:
            return False
        pull.wake_on_arrival = wake_on_arrival
        key = (pull.topic, pull.queue_id)
        pulls = self.held.get(key)
        if pulls is None:
            pulls = self.held[key] = {}
        pulls[pull] = None
        loop = self._loop
        if loop is None:        # not started (a test driving the service alone)
            loop = asyncio.get_running_loop()
        tick = math.ceil((loop.time() + timeout_ms / 1000) / DEADLINE_TICK_S)
        due = self._due.get(tick)
        if due is None:
            due = self._due[tick] = _Due(loop.call_at(tick * DEADLINE_TICK_S, self._expire, tick))
        due.pulls[pull] = None
        pull.deadline_tick = tick
        return True

    def _expire(self, tick: int) -> None:
        """The deadline of the pulls in `tick`'s bucket: answer them, one batch per queue."""
        due = self._due.pop(tick, None)
        if due is None:
            return
        by_queue: dict[QueueKey, list[HeldPull]] = {}
        for pull in due.pulls:
            pull.deadline_tick = None
            if self._take(pull):
                by_queue.setdefault((pull.topic, pull.queue_id), []).append(pull)
        for pulls in by_queue.values():
            _answer(pulls, False)

    def _untime(self, pull: HeldPull) -> None:
        """Take `pull` out of its deadline bucket; the bucket's timer goes when it empties."""
        tick = pull.deadline_tick
        if tick is None:
            return
        pull.deadline_tick = None
        due = self._due.get(tick)
        if due is None:
            return
        due.pulls.pop(pull, None)
        if not due.pulls:
            due.timer.cancel()
            del self._due[tick]

    def _take(self, pull: HeldPull) -> bool:
        """Unregister `pull` and its deadline; False when it was not held (already answered)."""
        key = (pull.topic, pull.queue_id)
        pulls = self.held.get(key)
        if pulls is None or pull not in pulls:
            return False
        del pulls[pull]
        if not pulls:
            del self.held[key]
        self._untime(pull)
        return True

    def cancel(self, pull: HeldPull) -> bool:
        """Stop holding `pull` without answering it (its owner gave up waiting: a held POP woken
        another way); False when it was not held."""
        return self._take(pull)

    def notify_message_arriving(self, topic: str, queue_id: int, max_offset: int, tags_code: int,
                                properties: dict[str, str] | None) -> None:
        """Answer the pulls of (topic, queue_id) waiting below `max_offset` whose filter matches the
        new message (RocketMQ `PullRequestHoldService.notifyMessageArriving`). Called by reput."""
        key = (topic, queue_id)
        pulls = self.held.get(key)
        if not pulls:
            return
        woken: list[HeldPull] = []
        for pull in pulls:
            if not pull.wake_on_arrival or max_offset <= pull.queue_offset:
                continue
            flt = pull.message_filter
            if flt is not None and not (
                    flt.match_by_consume_queue(tags_code)
                    and (not flt.needs_properties or flt.match_by_commit_log(properties))):
                continue
            woken.append(pull)
        if not woken:
            return
        if len(woken) == len(pulls):
            del self.held[key]
        else:
            for pull in woken:
                del pulls[pull]
        untime = self._untime
        for pull in woken:
            untime(pull)
        _answer(woken, True)

    def notify_run_arriving(self, topic: str, queue_id: int, queue_offset: int, units: list[tuple[int, int, int]],
                            properties: list[dict[str, str]]) -> None:
        """`notify_message_arriving` for each message of a batch, at consecutive queue offsets from
        `queue_offset` (`units[i]` is message i's (commit_log_offset, size, tags_code)): one lookup
        for the run when no pull waits on the queue (the usual case)."""
        if (topic, queue_id) not in self.held:
            return
        max_offset = queue_offset
        for (_, _, tags_code), props in zip(units, properties, strict=True):
            max_offset += 1
            self.notify_message_arriving(topic, queue_id, max_offset, tags_code, props)

    def sweep(self) -> int:
        """Wake every held pull whose queue has messages past its offset (and, with a filter and
        `has_match`, a matching one among them); returns how many."""
        woken = 0
        for (topic, queue_id), pulls in list(self.held.items()):
            max_offset = self._get_max_offset(topic, queue_id)
            due: list[HeldPull] = []
            for pull in pulls:
                if pull.wake_on_arrival and max_offset > pull.queue_offset:
                    flt, has_match = pull.message_filter, self._has_match
                    if flt is not None and has_match is not None \
                            and not has_match(topic, queue_id, pull.queue_offset, flt):
                        continue
                    due.append(pull)
            due = [pull for pull in due if self._take(pull)]
            if due:
                _answer(due, True)
                woken += len(due)
        return woken

    def release_all(self) -> None:
        """Answer every held pull now (broker stop) and refuse to hold new ones."""
        self._released = True
        for due in self._due.values():
            due.timer.cancel()
            for pull in due.pulls:
                pull.deadline_tick = None
        self._due.clear()
        while self.held:
            _, pulls = self.held.popitem()
            _answer(list(pulls), False)

    async def start(self) -> None:
        self._released = False
        self._loop = asyncio.get_running_loop()
        await self._sweeper.start()

    async def stop(self) -> None:
        self.release_all()
        await self._sweeper.stop()
        self._loop = None


def _answer(pulls: list[HeldPull], woken: bool) -> None:
    """Hand `pulls` (one queue's) to their responders, one batch per responder."""
    first = pulls[0].responder
    if all(pull.responder is first for pull in pulls):
        batches = [(first, pulls)]
    else:
        by_responder: dict[int, tuple[PullResponder, list[HeldPull]]] = {}
        for pull in pulls:
            by_responder.setdefault(id(pull.responder), (pull.responder, []))[1].append(pull)
        batches = list(by_responder.values())
    for responder, batch in batches:
        try:
            responder.answer(batch, woken)
        except Exception:       # a responder answers its own failures; this is a last resort
            log.exception("hold: answering %d held pulls of %s:%d failed", len(batch), batch[0].topic,
                          batch[0].queue_id)
