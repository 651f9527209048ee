"""Counters and histograms kept as plain numbers and exported at scrape time.

The metrics that change on every request (messages and bytes in and out, request latency) were
`prometheus_client` children: each `inc()` / `observe()` takes a lock and walks a few Python
frames, about 1.5 µs of the ~25 µs a one-at-a-time send cost the broker. The broker is one
event-loop thread, so nothing needs the lock: these tables add to a list in place and a
`Collector` turns them into the same metric families (names, labels, `_total`, `_bucket`,
`_count`, `_sum`) when Prometheus scrapes.

Label values come from clients (topics, groups, request codes), so every table is bounded: at most
`max_label_sets` label sets (`metrics_max_label_sets`, 10,000), then everything new is counted in one
more row whose labels are all "other". RocketMQ 5 has no such bound (its OpenTelemetry views keep
every label set); a client inventing names must not grow the broker's memory or its /metrics
answer without end. `prune(keep)` drops the rows of names that no longer exist (a deleted topic or
group), which frees their places.

A scrape renders off the event loop (`BrokerMetrics.render`): a `SnapshotCollector` first copies
what it reads, on the loop, into a collector whose `collect()` may then run in any thread."""

from __future__ import annotations

import copy
from abc import abstractmethod
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

LabelValues = tuple[str, ...]
OTHER = "other"
DEFAULT_MAX_LABEL_SETS = 10_000


class SnapshotCollector(Collector):
    """A collector that reads event-loop state. `snapshot()` runs on the loop (it may yield to it
    between chunks) and returns a collector over a copy: one that reads nothing mutable, so
    `generate_latest` can run it in a thread."""

    @abstractmethod
    async def snapshot(self) -> Collector:
        """A copy of what `collect()` would export now; safe to collect from any thread."""


class Collected(Collector):
    """Metric families already built (immutable once yielded): collected again as they are."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


class _Table(SnapshotCollector):
    """The rows and their bound, shared by both tables. Event-loop thread only (no lock)."""

    _width: int

    def __init__(self, label_names: Sequence[str], constant_labels: dict[str, str], max_label_sets: int) -> None:
        self._label_names = [*constant_labels, *label_names]
        self._constant = tuple(constant_labels.values())
        self._max_label_sets = max(max_label_sets, 1)
        self.other: LabelValues = (OTHER,) * len(label_names)
        self.rows: dict[LabelValues, list[float]] = {}

    def row(self, key: LabelValues) -> list[float]:
        """The mutable list of values of `key` (created at zero); past `max_label_sets` rows, the
        "other" row. Hot paths add to it in place, at once (a row may be pruned later)."""
        values = self.rows.get(key)
        if values is None:
            if key != self.other and len(self.rows) - (self.other in self.rows) >= self._max_label_sets:
                key = self.other
                values = self.rows.get(key)
                if values is not None:
                    return values
            values = self.rows[key] = [0.0] * self._width
        return values

    def prune(self, keep: Callable[[LabelValues], bool]) -> int:
        """Drop the rows whose key `keep` refuses (never the "other" row); returns how many."""
        dropped = [key for key in self.rows if key != self.other and not keep(key)]
        for key in dropped:
            del self.rows[key]
        return len(dropped)

    async def snapshot(self) -> Collector:
        frozen = copy.copy(self)       # shares only immutable parts (names, labels, bounds)
        frozen.rows = {key: values.copy() for key, values in self.rows.items()}
        return frozen


class CounterTable(_Table):
    """Several counters sharing one label set per key: `row(key)[i] += n` adds to counter i of
    `key`. `names[i]` is counter i's name without `_total`; `key` holds the values of
    `label_names` after the constant labels."""

    def __init__(self, names: Sequence[tuple[str, str]], label_names: Sequence[str],
                 constant_labels: dict[str, str], max_label_sets: int = DEFAULT_MAX_LABEL_SETS) -> None:
        super().__init__(label_names, constant_labels, max_label_sets)
        self._names = tuple(names)
        self._width = len(self._names)

    def value(self, index: int, key: LabelValues) -> float:
        values = self.rows.get(key)
        return values[index] if values is not None else 0.0

    def collect(self) -> Iterator[Metric]:
        for index, (name, documentation) in enumerate(self._names):
            family = CounterMetricFamily(name, documentation, labels=self._label_names)
            for key, values in self.rows.items():
                family.add_metric([*self._constant, *key], values[index])
            yield family

    def describe(self) -> Iterator[Metric]:
        for name, documentation in self._names:
            yield CounterMetricFamily(name, documentation, labels=self._label_names)


class HistogramTable(_Table):
    """One histogram per key with fixed upper `buckets` (seconds, ascending; +Inf is implied).
    `observe(key, value)` is a dict lookup, a bisect and two additions."""

    def __init__(self, name: str, documentation: str, label_names: Sequence[str],
                 constant_labels: dict[str, str], buckets: Sequence[float],
                 max_label_sets: int = DEFAULT_MAX_LABEL_SETS) -> None:
        super().__init__(label_names, constant_labels, max_label_sets)
        self._name, self._documentation = name, documentation
        self._bounds = tuple(buckets)
        self._width = len(self._bounds) + 2     # per key: [count in bucket 0 .. in +Inf, sum]

    def observe(self, key: LabelValues, value: float) -> None:
        counts = self.rows.get(key)
        if counts is None:
            counts = self.row(key)
        counts[bisect_left(self._bounds, value)] += 1
        counts[-1] += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._label_names)
        bounds = [*(_bound_text(b) for b in self._bounds), "+Inf"]
        for key, counts in self.rows.items():
            cumulative, buckets = 0.0, []
            for bound, count in zip(bounds, counts, strict=False):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([*self._constant, *key], buckets, counts[-1])
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._documentation, labels=self._label_names)


def _bound_text(bound: float) -> str:
    """A bucket's `le` label as prometheus_client writes it (`0.005`, `1.0`, `30.0`)."""
    return repr(float(bound))
