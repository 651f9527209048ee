"""Writing a DataFrame to a topic: `df.write.format("rocketq")` and `df.writeStream.format("rocketq")`.

Columns: `body` (binary or string, required), and optionally `tags` (string), `keys` (string,
space-separated keys as RocketMQ sends them), `properties` (map<string,string>) and `queue_id`
(int: the queue to send the row to; a null or missing one lets the producer pick queues round
robin). Other columns are ignored, so a DataFrame read from one topic can be written to another.

Each task sends its rows with a `Producer` on a private event loop, `sendBatchSize` rows per
SEND_BATCH_MESSAGE and `sendsInFlight` batches at once. Delivery is at-least-once: each row's
UNIQ_KEY is `<run>-<batch>-<partition>-<row>` — the run is the streaming query's id (the batch id
is the micro-batch's) or, for a batch write, an id drawn once per write job (batch 0) — so a
retried task or a re-run micro-batch sends duplicates with the same UNIQ_KEY, which consumers can
drop."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import uvloop
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructType

from client.producer.producer import Producer
from client.spark.options import SinkOptions
from protocol.message import PROPERTY_UNIQ_KEY, Message
from protocol.model import MessageQueue

_COLUMN_TYPES = {
    "body": (BinaryType(), StringType()),
    "tags": (StringType(),),
    "keys": (StringType(),),
    "properties": (MapType(StringType(), StringType()), MapType(StringType(), StringType(), False)),
    "queue_id": (IntegerType(),),
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


def batch_messages(topic: str, batch: pa.RecordBatch, key_prefix: str,
                   first_row: int) -> list[tuple[int | None, Message]]:
    """(queue id or None, message) of every row; UNIQ_KEY `<key_prefix>-<row number>`."""
    rows = []
    columns = zip(_column(batch, "body"), _column(batch, "tags"), _column(batch, "keys"),
                  _column(batch, "properties"), _column(batch, "queue_id"), strict=True)
    for row, (body, tags, keys, properties, queue_id) in enumerate(columns, start=first_row):
        if body is None:
            raise ValueError(f"row {row} of the write has a null body")
        props = {k: v for k, v in (properties or []) if v is not None}   # type: ignore[attr-defined]
        props[PROPERTY_UNIQ_KEY] = f"{key_prefix}-{row}"
        payload = body.encode() if isinstance(body, str) else body
        message = Message(topic, payload, tags=tags, keys=keys, properties=props)   # type: ignore[arg-type]
        rows.append((queue_id if isinstance(queue_id, int) else None, message))
    return rows


async def _send(producer: Producer, options: SinkOptions, broker_name: str,
                rows: list[tuple[int | None, Message]], gate: asyncio.Semaphore) -> None:
    by_queue: dict[int | None, list[Message]] = {}
    for queue_id, message in rows:
        by_queue.setdefault(queue_id, []).append(message)
    size = options.send_batch_size

    async def one(queue_id: int | None, chunk: list[Message]) -> None:
        async with gate:
            queue = None if queue_id is None else MessageQueue(options.topic, broker_name, queue_id)
            await producer.send_batch(chunk, queue=queue)

    async with asyncio.TaskGroup() as group:
        for queue_id, messages in by_queue.items():
            for low in range(0, len(messages), size):
                group.create_task(one(queue_id, messages[low:low + size]))


def send_partition(options: SinkOptions, batches: Iterator[pa.RecordBatch], key_prefix: str) -> int:
    """Send every row of `batches` on a private event loop; returns the rows sent."""
    async def main() -> int:
        ssl_context = options.tls.context()
        producer = Producer(options.producer_group, list(options.endpoints),
                            send_msg_timeout_ms=options.send_timeout_ms, credentials=options.credentials,
                            ssl_context=ssl_context)
        gate = asyncio.Semaphore(options.sends_in_flight)
        sent = 0
        async with producer:
            broker_name = ""
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                rows = batch_messages(options.topic, batch, key_prefix, sent)
                if not broker_name and any(q is not None for q, _ in rows):
                    queues = await producer._publish_queues(options.topic)
                    broker_name = queues[0].broker_name if queues else ""
                await _send(producer, options, broker_name, rows, gate)
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
