"""`TimerCollector`: the timer store's figures on /metrics, read at scrape time (RocketMQ 5's
timer metrics: `rocketmq_timer_enqueue_total`, `..._dequeue_total`, `..._message_snapshot`, under
our `rocketq_` prefix): one gauge and three counters per broker, a handful of integer reads on the
event loop per scrape."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class TimerCounts(Protocol):
    """What `TimerMessageStore` exposes: `scheduled` (stored, not yet delivered), `enqueued`,
    `delivered` and `rolled` (this run's counts)."""

    @property
    def scheduled(self) -> int: ...

    @property
    def enqueued(self) -> int: ...

    @property
    def delivered(self) -> int: ...

    @property
    def rolled(self) -> int: ...


class TimerCollector:
    def __init__(self, timer: TimerCounts, labels: Mapping[str, str]) -> None:
        self._timer = timer
        self._names, self._values = list(labels), list(labels.values())

    def collect(self) -> Iterator[Metric]:
        timer, names, values = self._timer, self._names, self._values
        gauge = GaugeMetricFamily("rocketq_timer_scheduled_messages",
                                  "Timer messages stored and not yet delivered.", labels=names)
        gauge.add_metric(values, timer.scheduled)
        yield gauge
        for name, text, value in (
                ("rocketq_timer_enqueued", "Timer messages put in the wheel (or delivered at once) by the timer "
                                           "store.", timer.enqueued),
                ("rocketq_timer_delivered", "Timer messages delivered to their topic.", timer.delivered),
                ("rocketq_timer_rolled", "Timer messages due beyond timer_roll_window_slots, stored again "
                                         "(TIMER_ROLL_TIMES + 1).", timer.rolled)):
            counter = CounterMetricFamily(name, text, labels=names)
            counter.add_metric(values, value)
            yield counter
