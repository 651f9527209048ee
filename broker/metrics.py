"""`BrokerMetrics`: Prometheus metrics with RocketMQ 5's names (PROTOCOL.md "Metrics"), in a
registry owned by the broker (never the global one), served on `metrics_port` (default 5557, bound
to `listen_host`; 0: no endpoint) by `MetricsHttpServer` on the event loop.

Counters and the latency histograms are updated as requests run; everything that is a state (lag,
in flight, ready, counts, sizes, disk use) is computed at scrape time by the collectors of
`lag_collector.py`, registered with `add_collector`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.registry import Collector

from broker.lag_collector import BrokerStateCollector, sample_disk
from broker.metric_tables import CounterTable, HistogramTable
from broker.metrics_http import MetricsHttpServer
from broker.remoting.guard import CLOSE_REASONS


class BrokerMetrics:
    def __init__(self, cluster: str, node_id: str, store_path: Path | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = {"cluster": cluster, "node_id": node_id}
        common = ["cluster", "node_id"]
        # Updated on every request: plain tables exported at scrape time (see `metric_tables`).
        self.messages_in = CounterTable((("rocketmq_messages_in", "Messages stored by sends."),
                                         ("rocketmq_throughput_in", "Message body bytes stored by sends.")),
                                        ["topic"], self._labels)
        self.messages_out = CounterTable((("rocketmq_messages_out", "Messages returned by pulls."),
                                          ("rocketmq_throughput_out", "Stored bytes returned by pulls.")),
                                         ["topic", "consumer_group"], self._labels)
        self.rpc_latency = HistogramTable("rocketmq_rpc_latency", "Request handling time in seconds.",
                                          ["request_code", "response_code"], self._labels,
                                          (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 1, 5, 30))
        for table in (self.messages_in, self.messages_out, self.rpc_latency):
            self.registry.register(table)
        self._latency_keys: dict[tuple[int, int], tuple[str, str]] = {}
        self.held_pulls = Gauge("rocketq_held_pulls", "Pulls held by long polling.", common,
                                registry=self.registry)
        self.reput_lag_bytes = Gauge("rocketq_reput_lag_bytes", "Commit-log bytes not yet dispatched.",
                                     common, registry=self.registry)
        self.fsync_latency = Histogram("rocketq_fsync_latency_seconds", "Commit-log fsync round time.",
                                       common, registry=self.registry,
                                       buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5))
        self._fsync_child = self.fsync_latency.labels(**self._labels)
        self.send_to_dlq = Counter("rocketmq_send_to_dlq_messages", "Messages moved to a dead-letter queue.",
                                   [*common, "consumer_group"], registry=self.registry)
        self.schedule_backlog = Gauge("rocketq_schedule_backlog_messages",
                                      "Delayed messages stored but not yet delivered, per delay level.",
                                      [*common, "delay_level"], registry=self.registry)
        self.store_writable = Gauge("rocketq_store_writable",
                                    "1 while the store takes sends; 0 when refused (disk full or a write error).",
                                    common, registry=self.registry)
        self.connections_closed = Gauge("rocketq_connections_closed",
                                        "Connections the broker refused or closed, by reason "
                                        f"({', '.join(CLOSE_REASONS)}).", [*common, "reason"],
                                        registry=self.registry)
        self.buffered_bytes = Gauge("rocketq_connection_buffered_bytes",
                                    "Bytes held in partial frames and unsent responses, all connections.",
                                    common, registry=self.registry)
        self._state: BrokerStateCollector | None = None
        self._store_path = store_path
        self._http: MetricsHttpServer | None = None

    @property
    def labels(self) -> dict[str, str]:
        """The node labels every broker metric carries (`cluster`, `node_id`)."""
        return dict(self._labels)

    def add_collector(self, collector: Collector) -> None:
        """Register a scrape-time collector; a `BrokerStateCollector` also gets the disk sample
        (taken in a thread before each scrape) of `store_path`."""
        self.registry.register(collector)
        if isinstance(collector, BrokerStateCollector):
            self._state = collector

    def observe_fsync(self, seconds: float) -> None:
        self._fsync_child.observe(seconds)

    def on_stored(self, topic: str, count: int, size_bytes: int) -> None:
        row = self.messages_in.row((topic,))
        row[0] += count
        row[1] += size_bytes

    def on_pulled(self, group: str, topic: str, count: int, size_bytes: int) -> None:
        row = self.messages_out.row((topic, group))
        row[0] += count
        row[1] += size_bytes

    def observe_request(self, request_code: int, response_code: int, seconds: float) -> None:
        key = self._latency_keys.get((request_code, response_code))
        if key is None:
            key = self._latency_keys[(request_code, response_code)] = (str(request_code), str(response_code))
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
        """The text exposition: disk numbers sampled in a thread, then every collector on the loop."""
        if self._state is not None and self._store_path is not None:
            self._state.disk = await asyncio.to_thread(sample_disk, self._store_path)
        return generate_latest(self.registry)

    def on_dlq(self, group: str) -> None:
        self.send_to_dlq.labels(consumer_group=group, **self._labels).inc()

    def track_schedule(self, levels: int, backlog: Callable[[int], int]) -> None:
        """`backlog(level)` for levels 1..`levels`, read at scrape time."""
        for level in range(1, levels + 1):
            self.schedule_backlog.labels(delay_level=str(level), **self._labels).set_function(
                lambda level=level: backlog(level))  # type: ignore[misc]

    async def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: any free port); returns the port. Raises `OSError`
        naming the metrics endpoint when the port is taken."""
        http = MetricsHttpServer(self.render)
        try:
            bound = await http.start(host, port)
        except OSError as err:
            raise OSError(err.errno, f"cannot serve metrics on {host}:{port}: {err.strerror}; set "
                          f"metrics_port to a free port, or 0 to turn the endpoint off", "metrics_port") from err
        self._http = http
        return bound

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()
