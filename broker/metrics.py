"""`BrokerMetrics`: Prometheus metrics with RocketMQ 5's names (PROTOCOL.md "Metrics"), in a
registry owned by the broker (never the global one), served on `metrics_port` when it is > 0."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class BrokerMetrics:
    def __init__(self, cluster: str, node_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = {"cluster": cluster, "node_id": node_id}
        common = ["cluster", "node_id"]
        self.messages_in = Counter("rocketmq_messages_in", "Messages stored by sends.",
                                   [*common, "topic"], registry=self.registry)
        self.throughput_in = Counter("rocketmq_throughput_in", "Message body bytes stored by sends.",
                                     [*common, "topic"], registry=self.registry)
        self.messages_out = Counter("rocketmq_messages_out", "Messages returned by pulls.",
                                    [*common, "topic", "consumer_group"], registry=self.registry)
        self.throughput_out = Counter("rocketmq_throughput_out", "Stored bytes returned by pulls.",
                                      [*common, "topic", "consumer_group"], registry=self.registry)
        self.rpc_latency = Histogram("rocketmq_rpc_latency", "Request handling time in seconds.",
                                     [*common, "request_code", "response_code"], registry=self.registry,
                                     buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 1, 5, 30))
        self.held_pulls = Gauge("rocketq_held_pulls", "Pulls held by long polling.", common,
                                registry=self.registry)
        self._in_children: dict[str, tuple[Counter, Counter]] = {}
        self._out_children: dict[tuple[str, str], tuple[Counter, Counter]] = {}
        self._latency_children: dict[tuple[int, int], Histogram] = {}
        self.reput_lag_bytes = Gauge("rocketq_reput_lag_bytes", "Commit-log bytes not yet dispatched.",
                                     common, registry=self.registry)

    # Labelled children are looked up once per label set and kept: `.labels()` costs microseconds
    # and these run for every request.

    def on_stored(self, topic: str, count: int, size_bytes: int) -> None:
        children = self._in_children.get(topic)
        if children is None:
            children = self._in_children[topic] = (self.messages_in.labels(topic=topic, **self._labels),
                                                   self.throughput_in.labels(topic=topic, **self._labels))
        children[0].inc(count)
        children[1].inc(size_bytes)

    def on_pulled(self, group: str, topic: str, count: int, size_bytes: int) -> None:
        key = (group, topic)
        children = self._out_children.get(key)
        if children is None:
            children = self._out_children[key] = (
                self.messages_out.labels(topic=topic, consumer_group=group, **self._labels),
                self.throughput_out.labels(topic=topic, consumer_group=group, **self._labels))
        children[0].inc(count)
        children[1].inc(size_bytes)

    def observe_request(self, request_code: int, response_code: int, seconds: float) -> None:
        key = (request_code, response_code)
        child = self._latency_children.get(key)
        if child is None:
            child = self._latency_children[key] = self.rpc_latency.labels(
                request_code=str(request_code), response_code=str(response_code), **self._labels)
        child.observe(seconds)

    def track(self, held_pulls: Callable[[], int], reput_lag_bytes: Callable[[], int]) -> None:
        self.held_pulls.labels(**self._labels).set_function(held_pulls)
        self.reput_lag_bytes.labels(**self._labels).set_function(reput_lag_bytes)

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: any free port) in a thread; returns the port."""
        self._http_server, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(self._http_server.server_address[1])

    def close(self) -> None:
        server = getattr(self, "_http_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
