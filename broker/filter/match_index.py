"""`MatchIndex`: which queue offsets match each registered SQL92 subscription, recorded as messages
arrive, so a filtered pull reads only matching messages instead of evaluating every one.

This plays the part of RocketMQ's filter bitmaps (`CalcBitMapDispatcher` + `ConsumeQueueExt`,
computed at dispatch for the registered `ConsumerFilterData`), exactly instead of by bloom filter:
when reput has put a message into its consume queue it hands the message's properties (which the
put path already holds as a dict, so nothing is decoded) to `on_arrival`, which evaluates each
expression registered for the topic and appends the queue offset of a match to that expression's
list for the queue. Pure and synchronous; no clock.

Coverage: a queue's list covers [start_offset, next_offset): start_offset is the first arrival
after registration (or after a gap or a trim), next_offset the next offset expected. A pull may use
the list only when its queue_offset >= start_offset and next_offset is the queue's max offset
(nothing arrived unseen); otherwise it scans as usual. Bounded: at most `max_expressions`
registered (the oldest registration is dropped) and `max_offsets_per_queue` offsets per list (the
older half is dropped and start_offset moves up). Registrations outlive their consumers, as
RocketMQ keeps filter data of a group that went away, so a backlog that builds while a consumer is
offline is indexed too."""

from __future__ import annotations

from array import array
from bisect import bisect_left

from broker.filter.sql92 import Expression

DEFAULT_MAX_EXPRESSIONS = 256
DEFAULT_MAX_OFFSETS_PER_QUEUE = 1 << 20       # 8 MiB of offsets


class QueueMatches:
    """Matching queue offsets of one expression on one queue, ascending."""

    __slots__ = ("next_offset", "offsets", "start_offset")

    def __init__(self, start_offset: int) -> None:
        self.start_offset = self.next_offset = start_offset
        self.offsets = array("q")

    def covers(self, queue_offset: int, max_offset: int) -> bool:
        """True when every message in [queue_offset, max_offset) was seen."""
        return self.start_offset <= queue_offset and self.next_offset == max_offset

    def matches_from(self, queue_offset: int, limit: int) -> list[int]:
        """Up to `limit` matching offsets >= `queue_offset`."""
        start = bisect_left(self.offsets, queue_offset)
        return self.offsets[start:start + limit].tolist()


class _Registered:
    __slots__ = ("evaluate", "queues")

    def __init__(self, expression: Expression) -> None:
        self.evaluate = expression.evaluate
        self.queues: dict[int, QueueMatches] = {}


class MatchIndex:
    def __init__(self, *, max_expressions: int = DEFAULT_MAX_EXPRESSIONS,
                 max_offsets_per_queue: int = DEFAULT_MAX_OFFSETS_PER_QUEUE) -> None:
        self._max_expressions = max(max_expressions, 1)
        self._max_offsets = max(max_offsets_per_queue, 2)
        self._topics: dict[str, dict[str, _Registered]] = {}
        self._order: dict[tuple[str, str], None] = {}      # registration order, oldest first

    @property
    def registered_count(self) -> int:
        return len(self._order)

    def register(self, topic: str, expression: Expression) -> None:
        """Index `expression` on `topic` from the next arrival on (no-op when already registered)."""
        by_text = self._topics.setdefault(topic, {})
        if expression.text in by_text:
            return
        while len(self._order) >= self._max_expressions:
            old_topic, old_text = next(iter(self._order))
            self.unregister(old_topic, old_text)
        by_text = self._topics.setdefault(topic, {})
        by_text[expression.text] = _Registered(expression)
        self._order[(topic, expression.text)] = None

    def unregister(self, topic: str, text: str) -> None:
        self._order.pop((topic, text), None)
        by_text = self._topics.get(topic)
        if by_text is not None:
            by_text.pop(text, None)
            if not by_text:
                del self._topics[topic]

    def lookup(self, topic: str, text: str, queue_id: int) -> QueueMatches | None:
        """The list of `text` on (topic, queue_id), None when not registered or nothing arrived yet."""
        by_text = self._topics.get(topic)
        registered = by_text.get(text) if by_text is not None else None
        return registered.queues.get(queue_id) if registered is not None else None

    def on_arrival_run(self, topic: str, queue_id: int, queue_offset: int, properties: list[dict[str, str]]) -> None:
        """`on_arrival` of a batch's messages, at consecutive queue offsets from `queue_offset`: one
        lookup for the run when no expression is registered on `topic` (the usual case)."""
        if topic not in self._topics:
            return
        for i, props in enumerate(properties):
            self.on_arrival(topic, queue_id, queue_offset + i, props)

    def on_arrival(self, topic: str, queue_id: int, queue_offset: int, properties: dict[str, str]) -> None:
        """Record the message at `queue_offset` of (topic, queue_id) for every expression it
        matches. Called by reput for each message in queue order; an arrival out of order (a gap)
        restarts that queue's coverage at `queue_offset`."""
        by_text = self._topics.get(topic)
        if by_text is None:
            return
        for registered in by_text.values():
            matches = registered.queues.get(queue_id)
            if matches is None or matches.next_offset != queue_offset:
                matches = registered.queues[queue_id] = QueueMatches(queue_offset)
            matches.next_offset = queue_offset + 1
            try:
                matched = registered.evaluate(properties) is True
            except Exception:           # never: evaluation does not raise; keep reput going if it did
                matched = False
            if matched:
                offsets = matches.offsets
                offsets.append(queue_offset)
                if len(offsets) > self._max_offsets:
                    keep = len(offsets) // 2
                    del offsets[:len(offsets) - keep]
                    matches.start_offset = offsets[0]
