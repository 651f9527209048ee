"""Batch reads of a topic, and the partition reading that streams share.

Planning (driver): the topic's queues on every broker serving it (`endpoints` may be name servers
or brokers) and their [min, max) offsets are looked up once; each queue's
range [start, end) comes from startingOffsets / startingTimestamp and endingOffsets, and is cut into
partitions of at most maxRecordsPerPartition offsets (one partition per queue when it is smaller).

Reading (executor): Spark pickles the reader before it calls `read()`, so a `QueueRange` carries
everything a task needs (broker address, topic, queue, offsets, filter, pull settings, credentials, TLS) and the
connections are opened inside `read()`, on an event loop private to that partition."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import uvloop
from pyspark.sql.datasource import DataSourceReader, InputPartition

from client.api import ClientAPI
from client.spark.arrow import PulledBody, record_batch
from client.spark.options import (
    NO_TLS,
    Bound,
    Filter,
    OffsetSpec,
    PullSettings,
    QueueKey,
    SourceOptions,
    TlsSettings,
    bind_legacy,
    resolve_offset,
    split_range,
)
from client.spark.queues import (
    BrokerUnavailable,
    RangePuller,
    TopicQueues,
    offset_for_timestamp,
    queue_bounds,
    remoting_client,
    run_on_private_loop,
    topic_queues,
)
from protocol.signing import Credentials


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One task's work: queue offsets [start_offset, end_offset) of queue `queue_id` of broker
    `broker_name` (at `address`), plain picklable data."""

    address: str
    topic: str
    queue_id: int
    start_offset: int
    end_offset: int
    message_filter: Filter
    pull: PullSettings
    credentials: Credentials | None = None
    tls: TlsSettings = NO_TLS
    broker_name: str = ""
    endpoints: tuple[str, ...] = ()      # where `address` is looked up again when its broker is gone


async def _take(bodies: AsyncIterator[PulledBody], rows: int) -> list[PulledBody]:
    """Bodies from `bodies` until they cover `rows` offsets or it ends ([] once it has ended).
    Before returning it lets the loop run once more, so the pulls topped up meanwhile are on the
    wire, and the broker answers them, while the caller converts and Spark ships the batch."""
    taken: list[PulledBody] = []
    covered = 0
    async for pulled in bodies:
        taken.append(pulled)
        covered += pulled.high - pulled.low
        if covered >= rows:
            break
    await asyncio.sleep(0)
    return taken


_long_lived_objects_frozen = False   # about this process, as the collector's own state is


def _freeze_long_lived_objects() -> None:
    """Move this process's objects out of reach of the cyclic garbage collector, once per process
    (after its first batch: pyarrow imports pandas on first use).

    A Spark Python worker holds ~90k long-lived container objects (pyspark, pyarrow, pandas, ours).
    Reading churns through many short-lived ones (a few per pull in flight), so the collector
    promotes enough of them to run a full collection every few batches, and the daemon runs one
    after every task: each walks the whole heap (~40 ms), about half the worker's CPU. Frozen
    objects are skipped by every later collection; what is frozen is what was alive after a full
    collection, so only those of its objects that later die in a reference cycle are never freed.
    Once per process by a flag: `gc.get_freeze_count()` walks every frozen object (~7 ms)."""
    global _long_lived_objects_frozen
    if not _long_lived_objects_frozen:
        _long_lived_objects_frozen = True
        gc.collect()
        gc.freeze()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No automatic collection in the block (unless the collector is off anyway): for building
    a batch, which allocates ~8k acyclic tuples whose collections would walk the growing message
    list and columns again and again."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def read_range(part: QueueRange) -> Iterator[pa.RecordBatch]:
    """The Arrow batches of `part` (about `pull.arrow_batch_rows` rows each), pulled on a private
    event loop that lives as long as this generator."""
    loop = uvloop.new_event_loop()
    remoting = remoting_client(part.tls, part.credentials)
    api = ClientAPI(remoting)

    async def resolve() -> str:         # the master now (after an HA failover: the elected one)
        return (await topic_queues(api, part.endpoints, part.topic)).address(part.broker_name)

    puller = RangePuller(api, part.address, part.topic, part.queue_id, part.message_filter, part.pull,
                         resolve if part.endpoints and part.broker_name else None)
    bodies = puller.bodies(part.start_offset, part.end_offset)
    tags = part.message_filter.tags
    prefixes: dict[str, bytes] = {}
    try:
        while taken := loop.run_until_complete(_take(bodies, part.pull.arrow_batch_rows)):
            with _collector_paused():
                batch = record_batch(taken, tags, prefixes, part.broker_name)
            _freeze_long_lived_objects()
            if batch.num_rows:
                yield batch
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(bodies.aclose())
        with contextlib.suppress(Exception):
            loop.run_until_complete(remoting.close())
        loop.close()


def queue_ranges(options: SourceOptions, queues: TopicQueues,
                 ranges: dict[QueueKey, tuple[int, int]]) -> list[QueueRange]:
    """`QueueRange`s covering each queue's [start, end), each cut by maxRecordsPerPartition, taken
    from the brokers in turn (broker-a's first, broker-b's first, broker-a's second, ...; each
    broker's in queue id order): Spark starts a stage's tasks in partition order, so the tasks that
    run at once read from different brokers rather than all from the first one. A non-empty range
    of a broker no longer in the route raises `BrokerUnavailable`: its queues are waited for, never
    skipped."""
    per_broker: dict[str, list[QueueRange]] = {}
    for (broker_name, queue_id), (start, end) in sorted(ranges.items()):
        pieces = split_range(start, end, options.max_records_per_partition)
        if pieces and broker_name not in queues.addresses:
            raise BrokerUnavailable(f"broker {broker_name} of topic {options.topic!r} is not in its route")
        per_broker.setdefault(broker_name, []).extend(
            QueueRange(queues.address(broker_name), options.topic, queue_id, low, high, options.filter, options.pull,
                       options.credentials, options.tls, broker_name, options.endpoints) for low, high in pieces)
    return [part for parts in itertools.zip_longest(*per_broker.values()) for part in parts if part is not None]


def _offset_of(spec: OffsetSpec, queue: QueueKey, bounds: tuple[int, int], default: Bound) -> int:
    min_offset, max_offset = bounds
    if isinstance(spec, Bound):
        return min_offset if spec is Bound.EARLIEST else max_offset
    bound = spec.get(queue)
    if bound is None:
        return min_offset if default is Bound.EARLIEST else max_offset
    return resolve_offset(bound, min_offset, max_offset)


def bind_spec(spec: OffsetSpec, topic: str, queues: TopicQueues) -> OffsetSpec:
    """An offsets option in the legacy form (queue id → offset) bound to the topic's only broker
    (`bind_legacy`; `ValueError` when it has several)."""
    return spec if isinstance(spec, Bound) else bind_legacy(spec, topic, queues.broker_names)


async def starting_offsets(api: ClientAPI, options: SourceOptions, queues: TopicQueues,
                           bounds: dict[QueueKey, tuple[int, int]]) -> dict[QueueKey, int]:
    """(broker name, queue id) → first offset to read, from startingTimestamp or startingOffsets (a
    queue the JSON does not name starts at earliest)."""
    if options.starting_timestamp_ms is not None:
        timestamp_ms = options.starting_timestamp_ms
        found = await asyncio.gather(*(offset_for_timestamp(api, queues.address(b), options.topic, q, timestamp_ms,
                                                            *bounds[(b, q)]) for b, q in queues.queues))
        return dict(zip(queues.queues, found, strict=True))
    assert options.starting is not None
    spec = bind_spec(options.starting, options.topic, queues)
    return {q: _offset_of(spec, q, bounds[q], Bound.EARLIEST) for q in queues.queues}


async def plan_batch(api: ClientAPI, options: SourceOptions) -> list[QueueRange]:
    """The partitions of a batch read over every broker serving the topic; endingOffsets defaults
    to latest, a queue the JSON does not name ends at latest, and an end before its start reads
    nothing."""
    wait_ms = options.pull.broker_wait_ms
    queues = await topic_queues(api, options.endpoints, options.topic, wait_ms)
    bounds = await queue_bounds(api, queues, options.topic, wait_ms)
    starts = await starting_offsets(api, options, queues, bounds)
    ending = bind_spec(options.ending, options.topic, queues)
    ranges = {q: (starts[q], max(starts[q], _offset_of(ending, q, bounds[q], Bound.LATEST)))
              for q in queues.queues}
    return queue_ranges(options, queues, ranges)


class BatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        return run_on_private_loop(lambda api: plan_batch(api, options), options.credentials, options.tls)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueRange):   # Spark's stand-in when there are no partitions
            return iter(())
        return read_range(partition)
