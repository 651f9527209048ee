"""`BrokerMetrics`: Prometheus metrics with RocketMQ 5's names (PROTOCOL.md "Metrics"), in a
registry owned by the broker (never the global one), served on `metrics_port` (default 5557, bound
to `listen_host`; 0: no endpoint) by `MetricsHttpServer`.

Counters and the latency histograms are updated as requests run; everything that is a state (lag,
in flight, ready, counts, sizes, disk use) is computed at scrape time by the collectors of
`lag_collector.py`, registered with `add_collector`.

Bounded: every label a client can choose has at most `max_label_sets` values per metric
(`metrics_max_label_sets`, 10,000), then one "other" (`metric_tables`); a request code the broker
does not serve is labelled "unknown" and a response code outside `ResponseCode` "other", so random
codes add nothing; rows of topics and groups that no longer exist are dropped at the next scrape.
A scrape copies what it reads on the event loop (`SnapshotCollector.snapshot`, in chunks) and
renders the text in a thread, one scrape at a time, so a large exposition does not stall requests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from broker.lag_collector import BrokerStateCollector, sample_disk
from broker.metric_tables import (
    DEFAULT_MAX_LABEL_SETS,
    Collected,
    CounterTable,
    HistogramTable,
    LabelValues,
    SnapshotCollector,
)
from broker.remoting.guard import CLOSE_REASONS
from broker.timer.timer_metrics import TimerCollector, TimerCounts
from protocol.codes import RequestCode, ResponseCode
from protocol.metrics_http import MetricsEndpoint
from protocol.tls_accept import TlsAcceptor

UNKNOWN_REQUEST_CODE = "unknown"
OTHER_RESPONSE_CODE = "other"
C = TypeVar("C", bound=Collector)
_RESPONSE_CODES = frozenset(int(code) for code in ResponseCode)


class _Exposition(CollectorRegistry):
    """The snapshots of one scrape, collected in registration order (from any thread)."""

    def __init__(self, parts: list[Collector]) -> None:
        super().__init__(auto_describe=False)
        self._parts = parts

    def collect(self) -> Iterator[Metric]:
        for part in self._parts:
            yield from part.collect()


class BrokerMetrics(MetricsEndpoint):
    def __init__(self, cluster: str, node_id: str, store_path: Path | None = None, *,
                 max_label_sets: int = DEFAULT_MAX_LABEL_SETS) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._collectors: list[Collector] = []      # registration order, as a scrape renders them
        self._labels = {"cluster": cluster, "node_id": node_id}
        self._max_label_sets = max_label_sets
        common = ["cluster", "node_id"]
        # Updated on every request: plain tables exported at scrape time (see `metric_tables`).
        self.messages_in = CounterTable((("rocketmq_messages_in", "Messages stored by sends."),
                                         ("rocketmq_throughput_in", "Message body bytes stored by sends.")),
                                        ["topic"], self._labels, max_label_sets)
        self.messages_out = CounterTable((("rocketmq_messages_out", "Messages returned by pulls."),
                                          ("rocketmq_throughput_out", "Stored bytes returned by pulls.")),
                                         ["topic", "consumer_group"], self._labels, max_label_sets)
        self.rpc_latency = HistogramTable("rocketmq_rpc_latency", "Request handling time in seconds.",
                                          ["request_code", "response_code"], self._labels,
                                          (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 1, 5, 30), max_label_sets)
        self.send_to_dlq = CounterTable((("rocketmq_send_to_dlq_messages", "Messages moved to a dead-letter queue."),),
                                        ["consumer_group"], self._labels, max_label_sets)
        for table in (self.messages_in, self.messages_out, self.rpc_latency, self.send_to_dlq):
            self._register(table)
        self._request_codes = frozenset(int(code) for code in RequestCode)
        self._latency_keys: dict[tuple[int, int], LabelValues] = {}
        self._topic_exists: Callable[[str], bool] | None = None
        self._group_exists: Callable[[str], bool] | None = None
        self.held_pulls = self._register(Gauge("rocketq_held_pulls", "Pulls held by long polling.", common,
                                               registry=None))
        self.reput_lag_bytes = self._register(Gauge("rocketq_reput_lag_bytes", "Commit-log bytes not yet dispatched.",
                                                    common, registry=None))
        self.fsync_latency = self._register(Histogram(
            "rocketq_fsync_latency_seconds", "Commit-log fsync round time.", common, registry=None,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5)))
        self._fsync_child = self.fsync_latency.labels(**self._labels)
        self.schedule_backlog = self._register(Gauge(
            "rocketq_schedule_backlog_messages", "Delayed messages stored but not yet delivered, per delay level.",
            [*common, "delay_level"], registry=None))
        self.transactions_dropped = self._register(Counter(
            "rocketq_transaction_dropped", "Half messages dropped after transaction_check_max check-backs.",
            common, registry=None))
        self._dropped_child = self.transactions_dropped.labels(**self._labels)
        self.transactions_pending = self._register(Gauge(
            "rocketq_transaction_pending_messages", "Half messages neither committed nor rolled back yet.",
            common, registry=None))
        self.timer_lateness = self._register(Histogram(
            "rocketq_timer_delivery_lateness_seconds", "How long after its due time a timer message was delivered.",
            common, registry=None, buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 60)))
        self._lateness_child = self.timer_lateness.labels(**self._labels)
        self.store_writable = self._register(Gauge(
            "rocketq_store_writable", "1 while the store takes sends; 0 when refused (disk full or a write error).",
            common, registry=None))
        self.connections_closed = self._register(Gauge(
            "rocketq_connections_closed", "Connections the broker refused or closed, by reason "
            f"({', '.join(CLOSE_REASONS)}).", [*common, "reason"], registry=None))
        self.buffered_bytes = self._register(Gauge(
            "rocketq_connection_buffered_bytes", "Bytes held in partial frames and unsent responses, all connections.",
            common, registry=None))
        self._state: BrokerStateCollector | None = None
        self._store_path = store_path
        self.put_total = 0      # messages stored by sends since the start (GET_BROKER_RUNTIME_INFO)
        self.get_total = 0      # messages handed out by pulls and pops since the start
        self._render_lock = asyncio.Lock()

    @property
    def labels(self) -> dict[str, str]:
        """The node labels every broker metric carries (`cluster`, `node_id`)."""
        return dict(self._labels)

    def _register(self, collector: C) -> C:
        self.registry.register(collector)
        self._collectors.append(collector)
        return collector

    def add_collector(self, collector: Collector) -> None:
        """Register a scrape-time collector (a `SnapshotCollector` when it reads broker state; any
        other is collected on the loop at each scrape, so it must be small); a
        `BrokerStateCollector` also gets the disk sample (taken in a thread before each scrape) of
        `store_path`."""
        self._register(collector)
        if isinstance(collector, BrokerStateCollector):
            self._state = collector

    def set_request_codes(self, codes: Iterable[int]) -> None:
        """The request codes the broker serves; any other is observed as request_code="unknown"."""
        self._request_codes = frozenset(codes)
        self._latency_keys.clear()

    def track_names(self, topic_exists: Callable[[str], bool], group_exists: Callable[[str], bool]) -> None:
        """At each scrape, drop the rows of topics and groups that no longer exist (deleted)."""
        self._topic_exists, self._group_exists = topic_exists, group_exists

    def observe_fsync(self, seconds: float) -> None:
        self._fsync_child.observe(seconds)

    def on_stored(self, topic: str, count: int, size_bytes: int) -> None:
        key = (topic,)
        row = self.messages_in.rows.get(key) or self.messages_in.row(key)     # (`row`'s hit, inline: per send)
        row[0] += count
        row[1] += size_bytes
        self.put_total += count

    def on_pulled(self, group: str, topic: str, count: int, size_bytes: int) -> None:
        row = self.messages_out.row((topic, group))
        row[0] += count
        row[1] += size_bytes
        self.get_total += count

    def on_popped(self, count: int) -> None:
        """Messages a POP_MESSAGE handed out (counted in `get_total`; rocketmq_messages_out counts pulls)."""
        self.get_total += count

    def observe_request(self, request_code: int, response_code: int, seconds: float) -> None:
        """One handled request: a cached label pair for served codes; an unserved request code is
        "unknown" and a response code outside `ResponseCode` "other", neither cached."""
        key = self._latency_keys.get((request_code, response_code))
        if key is None:
            key = (str(request_code) if request_code in self._request_codes else UNKNOWN_REQUEST_CODE,
                   str(response_code) if response_code in _RESPONSE_CODES else OTHER_RESPONSE_CODE)
            if request_code in self._request_codes and response_code in _RESPONSE_CODES:
                self._latency_keys[(request_code, response_code)] = key
        self.rpc_latency.observe(key, seconds)

    def track(self, held_pulls: Callable[[], int], reput_lag_bytes: Callable[[], int]) -> None:
        self.held_pulls.labels(**self._labels).set_function(held_pulls)
        self.reput_lag_bytes.labels(**self._labels).set_function(reput_lag_bytes)

    def track_limits(self, writable: Callable[[], bool], closed: Callable[[str], int],
                     buffered_bytes: Callable[[], int]) -> None:
        """Issue 12's gauges: whether the store takes sends, connections closed per reason, and
        the bytes the connection guard holds; all read at scrape time."""
        self.store_writable.labels(**self._labels).set_function(lambda: float(writable()))
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason=reason, **self._labels).set_function(
                lambda reason=reason: closed(reason))  # type: ignore[misc]
        self.buffered_bytes.labels(**self._labels).set_function(buffered_bytes)

    async def render(self) -> bytes:
        """The text exposition, one scrape at a time: disk numbers sampled in a thread; rows of
        deleted topics and groups dropped; each collector's snapshot taken on the loop (a plain
        collector is collected there); the text rendered from the snapshots in a thread."""
        async with self._render_lock:
            if self._state is not None and self._store_path is not None:
                self._state.disk = await asyncio.to_thread(sample_disk, self._store_path)
            self._prune()
            parts: list[Collector] = []
            for collector in self._collectors:
                if isinstance(collector, SnapshotCollector):
                    parts.append(await collector.snapshot())
                else:
                    parts.append(Collected(collector.collect()))
            return await asyncio.to_thread(generate_latest, _Exposition(parts))

    def _prune(self) -> None:
        topic_exists, group_exists = self._topic_exists, self._group_exists
        if topic_exists is None or group_exists is None:
            return
        self.messages_in.prune(lambda key: topic_exists(key[0]))
        self.messages_out.prune(lambda key: topic_exists(key[0]) and group_exists(key[1]))
        self.send_to_dlq.prune(lambda key: group_exists(key[0]))

    def on_dlq(self, group: str) -> None:
        self.send_to_dlq.row((group,))[0] += 1

    def on_transaction_dropped(self) -> None:
        self._dropped_child.inc()

    def track_transactions(self, pending: Callable[[], int]) -> None:
        self.transactions_pending.labels(**self._labels).set_function(pending)

    def observe_timer_lateness(self, seconds: float) -> None:
        self._lateness_child.observe(max(0.0, seconds))

    def track_timer(self, timer: TimerCounts) -> None:
        """Scrape-time timer figures: rocketq_timer_scheduled_messages (gauge) and the counters
        rocketq_timer_enqueued_total, rocketq_timer_delivered_total, rocketq_timer_rolled_total
        (this run's; RocketMQ's timer metrics `timer_enqueue_total`... per broker)."""
        self.add_collector(TimerCollector(timer, self._labels))

    def track_schedule(self, levels: int, backlog: Callable[[int], int]) -> None:
        """`backlog(level)` for levels 1..`levels`, read at scrape time."""
        for level in range(1, levels + 1):
            self.schedule_backlog.labels(delay_level=str(level), **self._labels).set_function(
                lambda level=level: backlog(level))  # type: ignore[misc]

    async def serve(self, host: str, port: int, tls: TlsAcceptor | None = None) -> int:
        """Serve /metrics on host:port (0: any free port), HTTPS only with `tls` (the broker port's
        context and handshake timeout); returns the port. Raises `OSError` naming the metrics
        endpoint when the port is taken."""
        try:
            return await self.serve_metrics(self.render, host, port, tls)
        except OSError as err:
            raise OSError(err.errno, f"cannot serve metrics on {host}:{port}: {err.strerror}; set "
                          f"metrics_port to a free port, or 0 to turn the endpoint off", "metrics_port") from err
