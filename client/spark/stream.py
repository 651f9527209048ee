"""Structured Streaming reads of a topic.

The source's offset is the next queue offset of every queue of every broker serving the topic,
`{"<broker_name>": {"<queue_id>": next_offset}}` with keys sorted (see `client.spark.options`; a
checkpoint in the earlier `{"<queue_id>": next_offset}` form restarts when the topic has one
broker): it is what Spark writes to the checkpoint's offset log before a micro-batch runs, so a
restarted query reads the uncommitted batch again over exactly the same ranges and then goes on from
its end — no input lost, none read twice.

Each trigger looks the topic's route up again, so queues added to the topic, and brokers that join
its route, are read from their earliest offset. A broker that is down (does not answer, or is out of
the route while the offsets say it has data) makes the micro-batch wait and retry for up to
`brokerWaitTimeoutMs`, then fail: its queues are never skipped. `maxRecordsPerTrigger` caps the
offsets admitted per micro-batch (shared among the queues in proportion to their backlog);
`Trigger.AvailableNow` reads up to the offsets that were latest when the query started, in batches
of that cap, and stops. With `commitToGroup`, each committed batch's end offsets are stored as that
consumer group's offsets on the broker (UPDATE_CONSUMER_OFFSET), so the group's lag shows the
query's progress; the checkpoint stays the source of truth. Spark tells a source a batch is
committed when it plans the next one, so the group trails the query by one micro-batch (and keeps
the last batch's start when the query ends)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from client.api import ClientAPI
from client.spark.options import QueueKey, SourceOptions, admit, bind_legacy, offsets_from_json, offsets_to_json
from client.spark.queues import (
    NO_QUEUES,
    BrokerUnavailable,
    TopicQueues,
    queue_bounds,
    run_on_private_loop,
    topic_queues,
    wait_for_broker,
)
from client.spark.reader import QueueRange, queue_ranges, read_range, starting_offsets
from protocol.errors import ConnectionClosed, TopicNotExist

T = TypeVar("T")

log = logging.getLogger(__name__)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[QueueKey, int] | None = None    # Trigger.AvailableNow: the offsets to stop at

    def _run(self, work: Callable[[ClientAPI], Awaitable[T]]) -> T:
        return run_on_private_loop(work, self.options.credentials, self.options.tls)

    async def _queues(self, api: ClientAPI) -> TopicQueues:
        """The topic's queues; none yet when the topic does not exist (it may be created later)."""
        try:
            return await topic_queues(api, self.options.endpoints, self.options.topic, self.options.pull.broker_wait_ms)
        except TopicNotExist:
            return NO_QUEUES

    async def _bounds(self, api: ClientAPI) -> tuple[TopicQueues, dict[QueueKey, tuple[int, int]]]:
        """The queues and their bounds; a broker that does not answer is waited for with the
        route asked again each time (an HA failover names another master for the broker)."""
        async def both() -> tuple[TopicQueues, dict[QueueKey, tuple[int, int]]]:
            queues = await self._queues(api)
            try:
                return queues, await queue_bounds(api, queues, self.options.topic)
            except BrokerUnavailable as exc:
                raise ConnectionClosed("route", str(exc)) from exc

        return await wait_for_broker(both, f"offsets of {self.options.topic!r}", self.options.pull.broker_wait_ms)

    def _offsets(self, value: Mapping[str, object], queues: TopicQueues) -> dict[QueueKey, int]:
        """A checkpointed offset map (either JSON form) as (broker name, queue id) → offset."""
        return bind_legacy(offsets_from_json(value), self.options.topic, queues.broker_names)

    def initialOffset(self) -> dict[str, dict[str, int]]:
        async def work(api: ClientAPI) -> dict[QueueKey, int]:
            queues, bounds = await self._bounds(api)
            return await starting_offsets(api, self.options, queues, bounds) if queues.queues else {}

        return offsets_to_json(self._run(work))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        async def work(api: ClientAPI) -> dict[QueueKey, int]:
            _, bounds = await self._bounds(api)
            return {q: max_offset for q, (_, max_offset) in bounds.items()}

        self._target = self._run(work)

    def latestOffset(self, start: dict[str, object], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """`start` moved on by what the queues hold now (at most the AvailableNow target), within
        `limit`. A queue not in `start` is new (a queue added, or a broker that joined the route)
        and starts at its min offset; a queue of `start` whose broker is out of the route for now
        keeps its offset, so it is read on once the broker is back."""
        async def work(api: ClientAPI) -> dict[QueueKey, int]:
            queues, bounds = await self._bounds(api)
            begin = self._offsets(start, queues)
            full_start = {q: begin.get(q, bounds[q][0]) for q in bounds} | begin
            latest = {q: max_offset for q, (_, max_offset) in bounds.items()}
            if self._target is not None:
                latest = {q: min(offset, self._target.get(q, full_start.get(q, offset)))
                          for q, offset in latest.items()}
            latest = {q: max(latest.get(q, offset), offset) for q, offset in full_start.items()}
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            return admit(full_start, latest, max_rows)

        return offsets_to_json(self._run(work))

    def partitions(self, start: dict[str, object], end: dict[str, object]) -> Sequence[InputPartition]:
        """The ranges between two offsets of the checkpoint. A broker with a non-empty range that
        is out of the route (down, not yet back) is waited for, up to brokerWaitTimeoutMs."""
        if start == end:
            return []

        async def work(api: ClientAPI) -> list[QueueRange]:
            async def plan() -> list[QueueRange]:
                queues, bounds = await self._bounds(api)
                begin, finish = self._offsets(start, queues), self._offsets(end, queues)
                ranges = {q: (begin[q] if q in begin else bounds.get(q, (0, 0))[0], offset)
                          for q, offset in finish.items()}
                try:
                    return queue_ranges(self.options, queues, ranges)
                except BrokerUnavailable as exc:
                    raise ConnectionClosed("route", str(exc)) from exc

            return await wait_for_broker(plan, f"micro-batch of {self.options.topic!r}",
                                         self.options.pull.broker_wait_ms)

        return self._run(work)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueRange):   # Spark's stand-in when there are no partitions
            return iter(())
        return read_range(partition)

    def commit(self, end: dict[str, object]) -> None:
        group = self.options.commit_to_group
        if group is None:
            return

        async def work(api: ClientAPI) -> None:
            queues = await self._queues(api)
            for (broker_name, queue_id), offset in sorted(self._offsets(end, queues).items()):
                if broker_name in queues.addresses:
                    await api.update_consumer_offset(queues.address(broker_name), group, self.options.topic,
                                                     queue_id, offset)

        try:
            self._run(work)
        except Exception:   # the checkpoint is the truth; a missed copy is caught up by the next commit
            log.warning("could not copy offsets %s of %s to group %s", end, self.options.topic, group,
                        exc_info=True)
