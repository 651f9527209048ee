"""Structured Streaming reads of a topic.

The source's offset is the next queue offset of every queue, `{"<queue_id>": next_offset}` with
keys sorted (see `client.spark.options`): it is what Spark writes to the checkpoint's offset log
before a micro-batch runs, so a restarted query reads the uncommitted batch again over exactly the
same ranges and then goes on from its end — no input lost, none read twice.

Each trigger looks the topic's queues up again, so queues added to the topic are read from their
earliest offset. `maxRecordsPerTrigger` caps the offsets admitted per micro-batch (shared among the
queues in proportion to their backlog); `Trigger.AvailableNow` reads up to the offsets that were
latest when the query started, in batches of that cap, and stops. With `commitToGroup`, each
committed batch's end offsets are stored as that consumer group's offsets on the broker
(UPDATE_CONSUMER_OFFSET), so the group's lag shows the query's progress; the checkpoint stays the
source of truth. Spark tells a source a batch is committed when it plans the next one, so the
group trails the query by one micro-batch (and keeps the last batch's start when the query ends)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from client.api import ClientAPI
from client.spark.options import SourceOptions, admit, offsets_from_json, offsets_to_json
from client.spark.queues import TopicQueues, queue_bounds, run_on_private_loop, topic_queues
from client.spark.reader import QueueRange, queue_ranges, read_range, starting_offsets
from protocol.errors import TopicNotExist

log = logging.getLogger(__name__)
_NO_QUEUES = TopicQueues("", "", ())


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[int, int] | None = None    # Trigger.AvailableNow: the offsets to stop at

    async def _queues(self, api: ClientAPI) -> TopicQueues:
        """The topic's queues; none yet when the topic does not exist (it may be created later)."""
        try:
            return await topic_queues(api, self.options.endpoints, self.options.topic)
        except TopicNotExist:
            return _NO_QUEUES

    async def _bounds(self, api: ClientAPI) -> tuple[TopicQueues, dict[int, tuple[int, int]]]:
        queues = await self._queues(api)
        return queues, await queue_bounds(api, queues.address, self.options.topic, queues.queue_ids)

    def initialOffset(self) -> dict[str, int]:
        async def work(api: ClientAPI) -> dict[int, int]:
            queues, bounds = await self._bounds(api)
            return await starting_offsets(api, self.options, queues, bounds) if queues.queue_ids else {}

        return offsets_to_json(run_on_private_loop(work, self.options.credentials))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        async def work(api: ClientAPI) -> dict[int, int]:
            _, bounds = await self._bounds(api)
            return {q: max_offset for q, (_, max_offset) in bounds.items()}

        self._target = run_on_private_loop(work, self.options.credentials)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """`start` moved on by what the queues hold now (at most the AvailableNow target), within
        `limit`; a queue not in `start` is new and starts at its min offset."""
        begin = offsets_from_json(start)

        async def work(api: ClientAPI) -> dict[int, int]:
            _, bounds = await self._bounds(api)
            full_start = {q: begin.get(q, bounds[q][0]) for q in bounds} | begin
            latest = {q: max_offset for q, (_, max_offset) in bounds.items()}
            if self._target is not None:
                latest = {q: min(offset, self._target.get(q, full_start.get(q, offset)))
                          for q, offset in latest.items()}
            latest = {q: max(latest.get(q, offset), offset) for q, offset in full_start.items()}
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            return admit(full_start, latest, max_rows)

        return offsets_to_json(run_on_private_loop(work, self.options.credentials))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        begin, finish = offsets_from_json(start), offsets_from_json(end)
        if begin == finish:
            return []

        async def work(api: ClientAPI) -> list[QueueRange]:
            queues, bounds = await self._bounds(api)
            ranges = {q: (begin[q] if q in begin else bounds.get(q, (0, 0))[0], offset)
                      for q, offset in finish.items()}
            return queue_ranges(self.options, queues, ranges)

        return run_on_private_loop(work, self.options.credentials)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueRange):   # Spark's stand-in when there are no partitions
            return iter(())
        return read_range(partition)

    def commit(self, end: dict[str, int]) -> None:
        group = self.options.commit_to_group
        if group is None:
            return
        offsets = offsets_from_json(end)

        async def work(api: ClientAPI) -> None:
            queues = await self._queues(api)
            for queue_id, offset in sorted(offsets.items()):
                await api.update_consumer_offset(queues.address, group, self.options.topic, queue_id, offset)

        try:
            run_on_private_loop(work, self.options.credentials)
        except Exception:   # the checkpoint is the truth; a missed copy is caught up by the next commit
            log.warning("could not copy offsets %s of %s to group %s", end, self.options.topic, group,
                        exc_info=True)
