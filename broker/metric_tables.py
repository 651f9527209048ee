"""Counters and histograms kept as plain numbers and exported at scrape time.

The metrics that change on every request (messages and bytes in and out, request latency) were
`prometheus_client` children: each `inc()` / `observe()` takes a lock and walks a few Python
frames, about 1.5 µs of the ~25 µs a one-at-a-time send cost the broker. The broker is one
event-loop thread, so nothing needs the lock: these tables add to a list in place and a
`Collector` turns them into the same metric families (names, labels, `_total`, `_bucket`,
`_count`, `_sum`) when Prometheus scrapes."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

LabelValues = tuple[str, ...]


class CounterTable(Collector):
    """Several counters sharing one label set per key: `add(key, a, b)` adds to counter 0 and 1 of
    `key`'s row. `names[i]` is counter i's name without `_total`; `key` holds the values of
    `label_names` after the constant labels. Event-loop thread only (no lock)."""

    def __init__(self, names: Sequence[tuple[str, str]], label_names: Sequence[str],
                 constant_labels: dict[str, str]) -> None:
        self._names = tuple(names)
        self._label_names = [*constant_labels, *label_names]
        self._constant = tuple(constant_labels.values())
        self.rows: dict[LabelValues, list[float]] = {}

    def row(self, key: LabelValues) -> list[float]:
        """The mutable list of counter values of `key` (created at zero): hot paths keep it and
        add to it in place."""
        values = self.rows.get(key)
        if values is None:
            values = self.rows[key] = [0.0] * len(self._names)
        return values

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


class HistogramTable(Collector):
    """One histogram per key with fixed upper `buckets` (seconds, ascending; +Inf is implied).
    `observe(key, value)` is a dict lookup, a bisect and two additions. Event-loop thread only."""

    def __init__(self, name: str, documentation: str, label_names: Sequence[str],
                 constant_labels: dict[str, str], buckets: Sequence[float]) -> None:
        self._name, self._documentation = name, documentation
        self._label_names = [*constant_labels, *label_names]
        self._constant = tuple(constant_labels.values())
        self._bounds = tuple(buckets)
        # per key: [count in bucket 0 .. count in +Inf bucket, sum]
        self.rows: dict[LabelValues, list[float]] = {}

    def observe(self, key: LabelValues, value: float) -> None:
        counts = self.rows.get(key)
        if counts is None:
            counts = self.rows[key] = [0.0] * (len(self._bounds) + 2)
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
