"""Writing a DataFrame to a topic: `df.write.format("rocketq")` and `df.writeStream.format("rocketq")`.

Columns: `body` (binary or string, required), and optionally `tags` (string), `keys` (string,
space-separated keys as RocketMQ sends them), `properties` (map<string,string>), `queue_id` (int:
the queue to send the row to) and `broker_name` (string: the broker of that queue; null or missing:
the first broker serving the topic). A row without a `queue_id` goes to a queue picked from its
UNIQ_KEY (a hash over every write queue of every broker), so a re-sent row goes where it went
before. Other columns are ignored, so a DataFrame read from one topic can be written to another.

Each task sends its rows with a `Producer` on a private event loop (`endpoints`: name servers or
brokers), `sendBatchSize` rows per SEND_BATCH_MESSAGE and `sendsInFlight` batches at once. Each
row's UNIQ_KEY is `<run>-<batch>-<partition>-<row>`: the run is the streaming query's id (kept
across restarts; the batch id is the micro-batch's) or, for a batch write, an id drawn once per
write job on the driver (batch 0), so a retried task, a speculative one and a re-run micro-batch
re-send the same ids. With option `dedup` (true by default) every row carries the `DEDUP` property:
brokers whose `store.dedup_window_ms` covers the retry store each row once (exactly-once); on a
broker with the window off, delivery is at-least-once with the same UNIQ_KEY on duplicates."""

from __future__ import annotations

import asyncio
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import uvloop
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructType

from client.producer.producer import Producer
from client.spark.options import SinkOptions
from protocol.message import PROPERTY_DEDUP, PROPERTY_UNIQ_KEY, Message
from protocol.model import MessageQueue

_COLUMN_TYPES = {
    "body": (BinaryType(), StringType()),
    "tags": (StringType(),),
    "keys": (StringType(),),
    "properties": (MapType(StringType(), StringType()), MapType(StringType(), StringType(), False)),
    "queue_id": (IntegerType(),),
    "broker_name": (StringType(),),
}
BATCH_ID_PROPERTY = "streaming.sql.batchId"    # task local properties Spark sets for micro-batches
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def check_columns(schema: StructType) -> None:
    """Raises `ValueError` when `body` is missing or a known column has another type."""
    types = {field.name: field.dataType for field in schema.fields}
    if "body" not in types:
        raise ValueError(f"writing to rocketq needs a body column (binary or string); columns: {', '.join(types)}")
    for name, allowed in _COLUMN_TYPES.items():
        if name in types and types[name] not in allowed:
            raise ValueError(f"column {name} is {types[name].simpleString()}, expected "
                             f"{' or '.join(t.simpleString() for t in allowed)}")


@dataclass(frozen=True)
class SentRows(WriterCommitMessage):
    partition: int
    rows: int


def _column(batch: pa.RecordBatch, name: str) -> list[object]:
    index = batch.schema.get_field_index(name)
    return batch.column(index).to_pylist() if index >= 0 else [None] * batch.num_rows


Row = tuple[str | None, int | None, Message]     # (broker name, queue id, message)


def batch_messages(topic: str, batch: pa.RecordBatch, key_prefix: str, first_row: int,
                   dedup: bool = False) -> list[Row]:
    """(broker name or None, queue id or None, message) of every row; UNIQ_KEY `<key_prefix>-<row
    number>`, and `DEDUP` when `dedup`."""
    rows: list[Row] = []
    columns = zip(_column(batch, "body"), _column(batch, "tags"), _column(batch, "keys"),
                  _column(batch, "properties"), _column(batch, "queue_id"), _column(batch, "broker_name"),
                  strict=True)
    for row, (body, tags, keys, properties, queue_id, broker_name) in enumerate(columns, start=first_row):
        if body is None:
            raise ValueError(f"row {row} of the write has a null body")
        props = {k: v for k, v in (properties or []) if v is not None}
        props[PROPERTY_UNIQ_KEY] = f"{key_prefix}-{row}"
        if dedup:
            props[PROPERTY_DEDUP] = "1"
        payload = body.encode() if isinstance(body, str) else body
        message = Message(topic, payload, tags=tags, keys=keys, properties=props)
        rows.append((broker_name if isinstance(broker_name, str) else None,
                     queue_id if isinstance(queue_id, int) else None, message))
    return rows


def queue_of(uniq_key: str, queues: Sequence[MessageQueue]) -> MessageQueue:
    """The queue a row without a `queue_id` goes to: the same one for the same UNIQ_KEY and queues."""
    return queues[zlib.crc32(uniq_key.encode()) % len(queues)]


async def _send(producer: Producer, options: SinkOptions, rows: list[Row], gate: asyncio.Semaphore) -> None:
    queues = sorted(await producer._publish_queues(options.topic), key=lambda q: (q.broker_name, q.queue_id))
    if not queues:
        raise ValueError(f"topic {options.topic!r} has no write queue")
    first_broker = queues[0].broker_name
    by_queue: dict[MessageQueue, list[Message]] = {}
    for broker_name, queue_id, message in rows:
        if queue_id is None:
            queue = queue_of((message.properties or {}).get(PROPERTY_UNIQ_KEY, ""), queues)
        else:
            queue = MessageQueue(options.topic, broker_name or first_broker, queue_id)
        by_queue.setdefault(queue, []).append(message)
    size = options.send_batch_size

    async def one(queue: MessageQueue, chunk: list[Message]) -> None:
        async with gate:
            await producer.send_batch(chunk, queue=queue)

    async with asyncio.TaskGroup() as group:
        for queue, messages in by_queue.items():
            for low in range(0, len(messages), size):
                group.create_task(one(queue, messages[low:low + size]))


def send_partition(options: SinkOptions, batches: Iterator[pa.RecordBatch], key_prefix: str) -> int:
    """Send every row of `batches` on a private event loop; returns the rows sent. A batch's rows
    are all acknowledged before the next batch is read."""
    async def main() -> int:
        ssl_context = options.tls.context()
        producer = Producer(options.producer_group, list(options.endpoints),
                            send_msg_timeout_ms=options.send_timeout_ms, credentials=options.credentials,
                            ssl_context=ssl_context)
        gate = asyncio.Semaphore(options.sends_in_flight)
        sent = 0
        async with producer:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                rows = batch_messages(options.topic, batch, key_prefix, sent, options.dedup)
                await _send(producer, options, rows, gate)
                sent += len(rows)
        return sent

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def _partition() -> tuple[int, TaskContext | None]:
    context = TaskContext.get()
    return (context.partitionId() if context is not None else 0), context


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, *, job_id: str) -> None:
        self.options, self.job_id = options, job_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        partition, _ = _partition()
        return SentRows(partition, send_partition(self.options, iterator, f"{self.job_id}-0-{partition}"))


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.fallback_id = uuid.uuid4().hex   # when a task does not see the query id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        partition, context = _partition()
        query_id = (context.getLocalProperty(QUERY_ID_PROPERTY) if context else None) or self.fallback_id
        batch_id = (context.getLocalProperty(BATCH_ID_PROPERTY) if context else None) or "0"
        return SentRows(partition, send_partition(self.options, iterator, f"{query_id}-{batch_id}-{partition}"))
