"""Metrics computed at scrape time (never on the send or pull path): consumer lag, in-flight and
ready messages per group, topic and queue, and the broker's state (topics, groups, connections,
store sizes, disk use). Names and labels are RocketMQ 5's (PROTOCOL.md "Metrics", RIP-46);
rocketq-only ones start with `rocketq_`.

Per (consumer_group, topic, queue_id) with a committed offset, RocketMQ 5's definitions:
- `rocketmq_consumer_lag_messages` = max offset - committed offset;
- `rocketmq_consumer_inflight_messages` = pull offset - committed offset (pulled, not committed);
- `rocketmq_consumer_ready_messages` = max offset - pull offset (stored, not pulled yet);
- `rocketmq_consumer_lag_latency` = seconds since the oldest unconsumed message (the one at the
  committed offset) was stored, 0 when there is none.
Without a pull offset (nothing pulled since the broker started) in flight is 0 and ready is the lag.
We label lag per queue (`queue_id`) as the issue asks; RocketMQ 5 keeps queue labels opt-in.

The store, the offset table and the registries are read on the event loop only (`snapshot`, in
chunks of `SNAPSHOT_CHUNK` queues with a yield to the loop between them); the text is rendered
from that copy in a thread. At most `max_label_sets` queues (groups, for the connection gauges) get
rows of their own; the rest are summed into one row labelled "other" (latency: their maximum)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.disk import DiskUsage, directory_bytes, disk_usage
from broker.metric_tables import DEFAULT_MAX_LABEL_SETS, OTHER, Collected, SnapshotCollector
from broker.offset.consumer_offset_manager import ConsumerOffsetManager
from broker.registry.consumer_manager import ConsumerManager
from broker.registry.producer_manager import ProducerManager
from broker.store.message_store import MessageStore
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from protocol.topics import is_retry_topic

_QUEUE_LABELS = ["cluster", "node_id", "topic", "consumer_group", "queue_id", "is_retry"]
SNAPSHOT_CHUNK = 500        # queues read per loop step by a scrape


@dataclass(frozen=True, slots=True)
class QueueLag:
    """One (consumer_group, topic, queue_id) at one instant; offsets are queue offsets."""

    consumer_group: str
    topic: str
    queue_id: int
    broker_offset: int        # the queue's max offset (next to be written)
    consumer_offset: int      # committed
    pull_offset: int | None   # next pull starts here; None when not pulled since start
    lag_messages: int
    inflight_messages: int
    ready_messages: int
    lag_latency_ms: int       # age of the oldest unconsumed message; 0 when none
    last_timestamp_ms: int    # store time of the last consumed message (committed - 1); 0 if none


def queue_lags(store: MessageStore, offsets: ConsumerOffsetManager, now_ms: int,
               consumer_group: str | None = None, topic: str | None = None) -> list[QueueLag]:
    """Lag of every queue with a committed offset (optionally of one group and/or topic), sorted by
    group, topic, queue. Used by the collector, GET_CONSUME_STATS and `rocketq top`."""
    result: list[QueueLag] = []
    for group, group_topic, queues in offsets.all_offsets():
        if (consumer_group is not None and group != consumer_group) or (topic is not None and group_topic != topic):
            continue
        for queue_id, committed in sorted(queues.items()):
            result.append(queue_lag(store, offsets, now_ms, group, group_topic, queue_id, committed))
    return result


def queue_lag(store: MessageStore, offsets: ConsumerOffsetManager, now_ms: int, group: str, topic: str,
              queue_id: int, committed: int) -> QueueLag:
    max_offset = store.get_max_offset(topic, queue_id)
    pulled = offsets.pull_offset(group, topic, queue_id)
    lag = max(0, max_offset - committed)
    pull_from = committed if pulled is None else min(max(pulled, committed), max_offset)
    latency_ms = 0
    if lag:
        stored_at_ms = store.get_store_time(topic, queue_id, max(committed, store.get_min_offset(topic, queue_id)))
        latency_ms = max(0, now_ms - stored_at_ms) if stored_at_ms is not None else 0
    last_ms = store.get_store_time(topic, queue_id, committed - 1) if committed > 0 else None
    return QueueLag(group, topic, queue_id, max_offset, committed, pulled, lag, pull_from - committed,
                    max_offset - pull_from, latency_ms, last_ms or 0)


class LagCollector(SnapshotCollector):
    def __init__(self, labels: dict[str, str], store: Callable[[], MessageStore | None],
                 offsets: ConsumerOffsetManager, now_ms: Callable[[], int],
                 max_label_sets: int = DEFAULT_MAX_LABEL_SETS) -> None:
        self._node = [labels["cluster"], labels["node_id"]]
        self._store, self._offsets, self._now_ms = store, offsets, now_ms
        self._max_label_sets = max_label_sets

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from _lag_families(self._node, [], self._max_label_sets)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        store = self._store()
        lags = [] if store is None else queue_lags(store, self._offsets, self._now_ms())
        yield from _lag_families(self._node, lags, self._max_label_sets)

    async def snapshot(self) -> Collector:
        """The lags of every queue, read `SNAPSHOT_CHUNK` queues per loop step."""
        now_ms = self._now_ms()
        queues = [(group, topic, queue_id, committed) for group, topic, by_queue in self._offsets.all_offsets()
                  for queue_id, committed in sorted(by_queue.items())]
        lags: list[QueueLag] = []
        for start in range(0, len(queues), SNAPSHOT_CHUNK):
            if start:
                await asyncio.sleep(0)
            store = self._store()
            if store is None:           # stopping
                break
            lags.extend(queue_lag(store, self._offsets, now_ms, *queue)
                        for queue in queues[start:start + SNAPSHOT_CHUNK])
        return _LagSnapshot(self._node, lags, self._max_label_sets)


class _LagSnapshot(Collector):
    """Lags read on the loop (immutable `QueueLag`s); their families are built where collected."""

    def __init__(self, node: list[str], lags: list[QueueLag], max_label_sets: int) -> None:
        self._node, self._lags, self._max_label_sets = node, lags, max_label_sets

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from _lag_families(self._node, self._lags, self._max_label_sets)


def _lag_families(node: list[str], lags: Sequence[QueueLag], max_label_sets: int) -> tuple[GaugeMetricFamily, ...]:
    """The four queue gauges of `lags`: the first `max_label_sets` queues each, then one "other"
    row summing the rest (lag latency: the largest)."""
    lag, latency, inflight, ready = families = (
        GaugeMetricFamily("rocketmq_consumer_lag_messages",
                          "Messages stored but not yet committed by the group.", labels=_QUEUE_LABELS),
        GaugeMetricFamily("rocketmq_consumer_lag_latency",
                          "Seconds since the oldest unconsumed message was stored.", labels=_QUEUE_LABELS),
        GaugeMetricFamily("rocketmq_consumer_inflight_messages",
                          "Messages pulled by the group but not committed.", labels=_QUEUE_LABELS),
        GaugeMetricFamily("rocketmq_consumer_ready_messages",
                          "Messages stored and not yet pulled by the group.", labels=_QUEUE_LABELS),
    )
    for item in lags[:max_label_sets]:
        values = [*node, item.topic, item.consumer_group, str(item.queue_id), str(is_retry_topic(item.topic)).lower()]
        lag.add_metric(values, item.lag_messages)
        latency.add_metric(values, item.lag_latency_ms / 1000)
        inflight.add_metric(values, item.inflight_messages)
        ready.add_metric(values, item.ready_messages)
    rest = lags[max_label_sets:]
    if rest:
        values = [*node, OTHER, OTHER, OTHER, OTHER]
        lag.add_metric(values, sum(item.lag_messages for item in rest))
        latency.add_metric(values, max(item.lag_latency_ms for item in rest) / 1000)
        inflight.add_metric(values, sum(item.inflight_messages for item in rest))
        ready.add_metric(values, sum(item.ready_messages for item in rest))
    return families


@dataclass(frozen=True, slots=True)
class DiskSample:
    """What a scrape reads from the file system (sampled in a thread before rendering)."""

    usage: DiskUsage
    store_bytes: int


def sample_disk(store_path: Path) -> DiskSample:
    """Blocking: run it in a thread."""
    return DiskSample(disk_usage(store_path), directory_bytes(store_path))


class BrokerStateCollector(SnapshotCollector):
    """Counts and sizes: topics, subscription groups, connections, store and disk. Its snapshot is
    built on the loop (a few dozen samples, plus one per group up to `max_label_sets`)."""

    def __init__(self, labels: dict[str, str], *, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 consumers: ConsumerManager, producers: ProducerManager, connections: Callable[[], int],
                 store: Callable[[], MessageStore | None], max_label_sets: int = DEFAULT_MAX_LABEL_SETS) -> None:
        self._labels = labels
        self._max_label_sets = max_label_sets
        self._topics, self._groups, self._consumers, self._producers = topics, groups, consumers, producers
        self._connections, self._store = connections, store
        self.disk: DiskSample | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._collect(describe=True)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._collect(describe=False)

    async def snapshot(self) -> Collector:
        return Collected(self._collect(describe=False))

    def _gauge(self, name: str, doc: str, value: float | None) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=list(self._labels))
        if value is not None:
            family.add_metric(list(self._labels.values()), value)
        return family

    def _collect(self, *, describe: bool) -> Iterator[GaugeMetricFamily]:
        store = None if describe else self._store()
        disk = None if describe else self.disk
        gauge = self._gauge
        yield gauge("rocketmq_topic_number", "Topics known to the broker.",
                    None if describe else len(self._topics.topics()))
        yield gauge("rocketmq_consumer_group_number", "Subscription groups known to the broker.",
                    None if describe else len(self._groups.groups()))
        yield gauge("rocketq_connections", "Open client connections.", None if describe else self._connections())
        consumer = GaugeMetricFamily("rocketmq_consumer_connections", "Consumer connections per group.",
                                     labels=[*self._labels, "consumer_group"])
        producer = GaugeMetricFamily("rocketmq_producer_connections", "Producer connections per group.",
                                     labels=[*self._labels, "producer_group"])
        if not describe:
            node = list(self._labels.values())
            _add_bounded(consumer, node, [(info.group_name, len(info.channels)) for info in self._consumers.groups()],
                         self._max_label_sets)
            _add_bounded(producer, node, sorted(self._producers.connection_counts().items()), self._max_label_sets)
        yield consumer
        yield producer
        yield gauge("rocketq_commit_log_bytes", "Commit-log bytes between its min and max offsets.",
                    None if store is None else store.commit_log_max_offset() - store.commit_log_min_offset())
        yield gauge("rocketmq_storage_flush_behind_bytes", "Commit-log bytes written but not yet fsynced.",
                    None if store is None else store.commit_log_max_offset() - store.commit_log_flushed_offset)
        yield gauge("rocketmq_storage_dispatch_behind_bytes", "Commit-log bytes not yet in consume queues.",
                    None if store is None else store.reput_lag_bytes)
        yield gauge("rocketmq_storage_size", "Bytes the store directory takes on disk.",
                    None if disk is None else disk.store_bytes)
        yield gauge("rocketq_disk_total_bytes", "Size of the file system holding the store.",
                    None if disk is None else disk.usage.total_bytes)
        yield gauge("rocketq_disk_free_bytes", "Free bytes on the file system holding the store.",
                    None if disk is None else disk.usage.free_bytes)
        yield gauge("rocketq_disk_used_ratio", "Used / total of the file system holding the store (0..1).",
                    None if disk is None else disk.usage.used_ratio)


def _add_bounded(family: GaugeMetricFamily, node: list[str], rows: Sequence[tuple[str, int]], limit: int) -> None:
    """One sample per (label, value) of `rows` up to `limit`, then one "other" sample summing the rest."""
    for label, value in rows[:limit]:
        family.add_metric([*node, label], value)
    if len(rows) > limit:
        family.add_metric([*node, OTHER], sum(value for _, value in rows[limit:]))
