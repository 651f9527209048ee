"""`ClientMetrics`: a client's own Prometheus metrics (RocketMQ 5's client metric names, PROTOCOL.md
"Metrics"), in a registry owned by the client instance (never the global one), served on
`http://<host>:<metrics_port>/metrics` when a producer or consumer asks for it with `metrics_port=`.

- `rocketmq_process_time` (histogram, seconds): listener time of each consume job, per group/topic;
- `rocketmq_await_time` (histogram, seconds): time pulled messages waited before the listener ran;
- `rocketmq_consumer_cached_messages` / `rocketmq_consumer_cached_bytes` (gauges, read at scrape
  time): messages and body bytes held in each process queue;
- `rocketmq_send_cost_time` (histogram, seconds): each send attempt, with `invocation_status`
  `success` or `failure`.
Every sample carries `client_id`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from client.consumer.process_queue import ProcessQueue
from protocol.model import MessageQueue

log = logging.getLogger(__name__)
BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60)
ProcessQueues = Callable[[], Mapping[MessageQueue, ProcessQueue]]


class _CachedCollector(Collector):
    """Cached messages and bytes of every registered consumer's process queues, at scrape time."""

    def __init__(self, client_id: str) -> None:
        self._client_id = client_id
        self.sources: dict[str, ProcessQueues] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["consumer_group", "topic", "queue_id", "client_id"]
        messages = GaugeMetricFamily("rocketmq_consumer_cached_messages", "Messages cached in a process queue.",
                                     labels=labels)
        size = GaugeMetricFamily("rocketmq_consumer_cached_bytes", "Message body bytes cached in a process queue.",
                                 labels=labels)
        for group, source in list(self.sources.items()):
            for mq, pq in list(source().items()):      # a copy: the loop thread may change the table
                values = [group, mq.topic, str(mq.queue_id), self._client_id]
                messages.add_metric(values, pq.msg_count)
                size.add_metric(values, pq.msg_size_bytes)
        yield messages
        yield size

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


class ClientMetrics:
    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.registry = CollectorRegistry(auto_describe=True)
        self.process_time = Histogram("rocketmq_process_time", "Listener time of a consume job, in seconds.",
                                      ["consumer_group", "topic", "client_id"], registry=self.registry,
                                      buckets=BUCKETS_S)
        self.await_time = Histogram("rocketmq_await_time",
                                    "Time pulled messages waited before their listener call, in seconds.",
                                    ["consumer_group", "topic", "client_id"], registry=self.registry,
                                    buckets=BUCKETS_S)
        self.send_cost_time = Histogram("rocketmq_send_cost_time", "Time of one send attempt, in seconds.",
                                        ["topic", "client_id", "invocation_status"], registry=self.registry,
                                        buckets=BUCKETS_S)
        self._send_cost_by: dict[tuple[str, bool], Histogram] = {}   # (topic, ok) -> its labelled histogram
        self._cached = _CachedCollector(client_id)
        self.registry.register(self._cached)
        self.port: int | None = None
        self._server: Any = None
        self._lock = threading.Lock()

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: any free port) in a thread, once; later calls return the
        port already served. Raises `OSError` when the port is taken."""
        with self._lock:
            if self.port is None:
                self._server, _ = start_http_server(port, addr=host, registry=self.registry)
                self.port = int(self._server.server_address[1])
            elif port not in (0, self.port):
                log.warning("client %s already serves metrics on port %d; not also on %d", self.client_id,
                            self.port, port)
            return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server, self.port = None, None

    def track_consumer(self, group: str, process_queues: ProcessQueues) -> Callable[[str, int, float, float], None]:
        """Report `group`'s process queues at scrape time; returns the consume observer
        `(topic, message_count, await_s, process_s)` its consume service calls once per job."""
        self._cached.sources[group] = process_queues

        def observe(topic: str, count: int, await_s: float, process_s: float) -> None:
            self.process_time.labels(group, topic, self.client_id).observe(process_s)
            self.await_time.labels(group, topic, self.client_id).observe(await_s)
        return observe

    def untrack_consumer(self, group: str) -> None:
        self._cached.sources.pop(group, None)

    def observe_send(self, topic: str, seconds: float, ok: bool) -> None:
        """One send attempt. The labelled child is looked up once per (topic, outcome): `labels()`
        on every send cost ~0.8 µs, more than the observation itself."""
        histogram = self._send_cost_by.get((topic, ok))
        if histogram is None:
            histogram = self._send_cost_by[topic, ok] = self.send_cost_time.labels(
                topic, self.client_id, "success" if ok else "failure")
        histogram.observe(seconds)
