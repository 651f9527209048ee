"""The scrape-time metric tables expose exactly what prometheus_client's own metrics would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from broker.metric_tables import CounterTable, HistogramTable

BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 1, 5, 30)
LABELS = {"cluster": "c", "node_id": "n"}


def _samples(registry: CollectorRegistry) -> list[str]:
    """The exposition's sample lines, without `_created` (the tables have no creation time)."""
    return sorted(line for line in generate_latest(registry).decode().splitlines()
                  if line and not line.startswith("#") and "_created" not in line)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["10", "11"]), st.sampled_from(["0", "17"]),
                          st.sampled_from([0.0, 0.0005, 0.0007, 0.001, 0.2, 5.0, 31.0])), max_size=40))
def test_histogram_table_matches_prometheus_histogram(observations: list[tuple[str, str, float]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    table = HistogramTable("rocketmq_rpc_latency", "h", ["request_code", "response_code"], LABELS, BUCKETS)
    ours.register(table)
    histogram = Histogram("rocketmq_rpc_latency", "h", [*LABELS, "request_code", "response_code"],
                          registry=theirs, buckets=BUCKETS)
    for request_code, response_code, seconds in observations:
        table.observe((request_code, response_code), seconds)
        histogram.labels(**LABELS, request_code=request_code, response_code=response_code).observe(seconds)
    assert _samples(ours) == _samples(theirs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 50), st.integers(0, 10_000)),
                max_size=40))
def test_counter_table_matches_prometheus_counters(adds: list[tuple[str, int, int]]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    table = CounterTable((("rocketmq_messages_in", "m"), ("rocketmq_throughput_in", "b")), ["topic"], LABELS)
    ours.register(table)
    messages = Counter("rocketmq_messages_in", "m", [*LABELS, "topic"], registry=theirs)
    size = Counter("rocketmq_throughput_in", "b", [*LABELS, "topic"], registry=theirs)
    for topic, count, size_bytes in adds:
        row = table.row((topic,))
        row[0] += count
        row[1] += size_bytes
        messages.labels(**LABELS, topic=topic).inc(count)
        size.labels(**LABELS, topic=topic).inc(size_bytes)
    assert _samples(ours) == _samples(theirs)
