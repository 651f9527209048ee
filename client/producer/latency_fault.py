"""Which queue a send goes to when brokers fail or slow down (RocketMQ `MQFaultStrategy` and
`LatencyFaultToleranceImpl`). Pure: times are passed in.

Without fault tolerance (`send_latency_fault_enable=False`, RocketMQ's default) a send goes to the
next queue round-robin, and a retry to the next queue of a *different* broker than the one that
just failed. With it, a broker that failed is avoided for 10 minutes and one that answered slowly
for a while that grows with its latency (the tables below); when every broker is being avoided the
one whose ban ends first is used."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from protocol.model import MessageQueue

LATENCY_MAX_MS = (50, 100, 550, 1_000, 2_000, 3_000, 15_000)
NOT_AVAILABLE_DURATION_MS = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)
ISOLATION_LATENCY_MS = 30_000       # a failed send counts as this slow: avoided for 10 minutes


def not_available_duration_ms(latency_ms: int) -> int:
    """How long a broker that answered in `latency_ms` is avoided (RocketMQ `computeNotAvailableDuration`):
    the duration of the largest `LATENCY_MAX_MS` step at or below the latency."""
    index = bisect_left(LATENCY_MAX_MS, latency_ms + 1) - 1
    return NOT_AVAILABLE_DURATION_MS[index] if index >= 0 else 0


class LatencyFaultTolerance:
    """broker name -> the time (ms, any monotonic clock) until which it is avoided."""

    def __init__(self) -> None:
        self._until: dict[str, int] = {}

    def update(self, broker_name: str, latency_ms: int, now_ms: int, *, isolation: bool = False) -> None:
        """Record a send's outcome: `isolation` for a failure (avoided for 10 minutes)."""
        duration = not_available_duration_ms(ISOLATION_LATENCY_MS if isolation else latency_ms)
        if duration > 0:
            self._until[broker_name] = now_ms + duration
        else:
            self._until.pop(broker_name, None)

    def is_available(self, broker_name: str, now_ms: int) -> bool:
        return self._until.get(broker_name, 0) <= now_ms

    def least_bad(self, broker_names: Sequence[str]) -> str | None:
        """Of `broker_names`, the one whose ban ends first (None for an empty list)."""
        return min(broker_names, key=lambda name: self._until.get(name, 0), default=None)


def select_queue(queues: Sequence[MessageQueue], counter: int, last_failed_broker: str | None,
                 faults: LatencyFaultTolerance | None, now_ms: int) -> MessageQueue:
    """The queue for a send: the first queue from `queues[counter % len]` on (round-robin order)
    that is not on `last_failed_broker` (unless it is the only broker) and, with `faults`, is on an
    available broker; when none is, a queue of the least bad other broker. `queues` must not be
    empty. RocketMQ `MQFaultStrategy#selectOneMessageQueue`."""
    size = len(queues)
    brokers = {mq.broker_name for mq in queues}
    rotation = [queues[(counter + step) % size] for step in range(size)]
    for mq in rotation:
        if mq.broker_name == last_failed_broker and len(brokers) > 1:
            continue
        if faults is None or faults.is_available(mq.broker_name, now_ms):
            return mq
    candidates = sorted(brokers - {last_failed_broker}) or sorted(brokers)
    best = faults.least_bad(candidates) if faults is not None else candidates[0]
    return next(mq for mq in rotation if mq.broker_name == best)
