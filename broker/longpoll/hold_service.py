"""`HoldService`: pulls that found nothing wait here for a matching message (long polling, §3).

Each held pull is a future with its own deadline (`asyncio.timeout`), so it is answered on time
without a scan (PROTOCOL.md deliberate difference 5); the reput step calls
`notify_message_arriving` after dispatching each message, which resolves the futures whose filter
matches at once. No lost wake-ups: `wait` registers first, then re-checks the queue's max offset.
A safety sweep every `check_interval_ms` wakes pulls whose queue has grown; correctness never
depends on it. Unlike RocketMQ's periodic scan, which ignores the filter, the sweep asks
`has_match` (when given) whether a filtered pull would find a matching message now, so a held
pull with a filter is never answered because non-matching messages arrived."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker.filter.message_filter import MessageFilter
from protocol.service import Service

QueueKey = tuple[str, int]
HasMatch = Callable[[str, int, int, MessageFilter], bool]
"""`has_match(topic, queue_id, queue_offset, message_filter)`: would a read find a match now?"""


class HeldPull:
    __slots__ = ("future", "message_filter", "queue_offset", "wake_on_arrival")

    def __init__(self, future: asyncio.Future[bool], queue_offset: int,
                 message_filter: MessageFilter | None, wake_on_arrival: bool) -> None:
        self.future, self.queue_offset = future, queue_offset
        self.message_filter, self.wake_on_arrival = message_filter, wake_on_arrival


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
        self._released = False

    @property
    def held_count(self) -> int:
        return sum(len(pulls) for pulls in self.held.values())

    async def wait(self, topic: str, queue_id: int, queue_offset: int,
                   message_filter: MessageFilter | None, timeout_ms: int, *,
                   wake_on_arrival: bool = True) -> bool:
        """Hold until a message past `queue_offset` that passes `message_filter` arrives on the queue
        (True), or `timeout_ms` passes or the broker stops (False). `wake_on_arrival=False` is short
        polling: only the deadline or a stop ends it."""
        if self._released or timeout_ms <= 0:
            return False
        key = (topic, queue_id)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = HeldPull(future, queue_offset, message_filter, wake_on_arrival)
        pulls = self.held.get(key)
        if pulls is None:
            pulls = self.held[key] = {}
        pulls[entry] = None
        try:
            if wake_on_arrival and self._get_max_offset(topic, queue_id) > queue_offset:
                return True
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    return await future
            except TimeoutError:
                return False
        finally:
            pulls.pop(entry, None)
            if not pulls and self.held.get(key) is pulls:
                del self.held[key]

    def notify_message_arriving(self, topic: str, queue_id: int, max_offset: int, tags_code: int,
                                properties: dict[str, str] | None) -> None:
        """Wake the pulls of (topic, queue_id) waiting below `max_offset` whose filter matches the
        new message (RocketMQ `PullRequestHoldService.notifyMessageArriving`). Called by reput."""
        pulls = self.held.get((topic, queue_id))
        if not pulls:
            return
        for entry in list(pulls):
            if not entry.wake_on_arrival or max_offset <= entry.queue_offset or entry.future.done():
                continue
            flt = entry.message_filter
            if flt is not None and not (
                    flt.match_by_consume_queue(tags_code)
                    and (not flt.needs_properties or flt.match_by_commit_log(properties))):
                continue
            entry.future.set_result(True)
            del pulls[entry]

    def sweep(self) -> int:
        """Wake every held pull whose queue has messages past its offset (and, with a filter and
        `has_match`, a matching one among them); returns how many."""
        woken = 0
        for (topic, queue_id), pulls in list(self.held.items()):
            max_offset = self._get_max_offset(topic, queue_id)
            for entry in list(pulls):
                if entry.wake_on_arrival and max_offset > entry.queue_offset and not entry.future.done():
                    flt, has_match = entry.message_filter, self._has_match
                    if flt is not None and has_match is not None \
                            and not has_match(topic, queue_id, entry.queue_offset, flt):
                        continue
                    entry.future.set_result(True)
                    woken += 1
        return woken

    def release_all(self) -> None:
        """Answer every held pull now (broker stop) and refuse to hold new ones."""
        self._released = True
        for pulls in list(self.held.values()):
            for entry in list(pulls):
                if not entry.future.done():
                    entry.future.set_result(False)

    async def start(self) -> None:
        self._released = False
        await self._sweeper.start()

    async def stop(self) -> None:
        self.release_all()
        await self._sweeper.stop()
