"""Read and write rocketq topics from PySpark: a Spark 4 Python data source named `rocketq`.

    from client.spark import register
    register(spark)
    df = (spark.read.format("rocketq").option("endpoints", "127.0.0.1:10911").option("topic", "orders")
          .option("startingOffsets", "earliest").load())

Needs the `spark` extra (`pip install 'rocketq[spark]'`: pyspark >= 4.2, pyarrow). The schema is
`SCHEMA_DDL`. Options (case-insensitive):

- `endpoints` (required): name server or broker addresses "host:port;host:port" (the topic is read
  on every broker serving it); `topic` (required).
- `startingOffsets`: `earliest` (batch default), `latest` (streaming default), or JSON broker name
  → queue id → queue offset, -2 earliest, -1 latest: `{"broker-a": {"0": 10, "1": -2}}` (the
  one-level `{"0": 10}` still works for a topic on one broker); or `startingTimestamp` (epoch ms):
  each queue from its first message stored at or after it.
- `endingOffsets` (batch only): `latest` (default), `earliest` or JSON as above.
- `tags` (a TAG expression, "A || B") or `sql` (an SQL92 expression), evaluated by the broker.
- `maxRecordsPerPartition` (1,000,000): longer queue ranges are split into several tasks.
- `maxRecordsPerTrigger` (streaming): offsets admitted per micro-batch over all queues.
- `commitToGroup` (streaming): copy committed offsets to this consumer group on the broker.
- `failOnDataLoss` (true): fail when a range is no longer (or not yet) on the broker.
- `brokerWaitTimeoutMs` (120,000): how long a broker that does not answer (down, restarting) is
  waited for and retried before the read (or micro-batch) fails; its queues are never skipped.
- tuning: `pullBatchSize` (32, the broker's default per-pull cap: ask more only of a broker whose
  `store.max_transfer_count_on_message_in_memory` is raised), `pullDepth` (8 pulls in flight per
  task), `pullTimeoutMs`, `arrowBatchRows` (8,192).

Writes (`df.write.format("rocketq")`, `df.writeStream.format("rocketq")`): see `client.spark.sink`.
"""

from __future__ import annotations

import uuid

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from client.spark.active import activate
from client.spark.arrow import ARROW_SCHEMA, SCHEMA, SCHEMA_DDL
from client.spark.options import SinkOptions, SourceOptions
from client.spark.reader import BatchReader
from client.spark.sink import BatchWriter, StreamWriter, check_columns
from client.spark.stream import StreamReader
from client.spark.workers import WorkerPythonError, check_workers

SHORT_NAME = "rocketq"


class RocketqDataSource(DataSource):
    """The `rocketq` format: batch and streaming reads, batch and streaming writes."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        check_columns(schema)
        return BatchWriter(SinkOptions.parse(self.options), job_id=uuid.uuid4().hex)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        check_columns(schema)
        return StreamWriter(SinkOptions.parse(self.options))


def register(spark: SparkSession, *, check: bool = True) -> None:
    """Make `format("rocketq")` available in `spark` (reads and writes, batch and streaming). With
    `check` (the default) it first runs one tiny task to make sure Spark's Python workers can import
    the client, and raises `WorkerPythonError` (naming the worker Python and the fix: PYSPARK_PYTHON,
    or `client.spark.session.local_session`) when they cannot. `spark` becomes the calling thread's
    active session: Spark looks the source up there, so another thread calls
    `client.spark.session.activate(spark)` (or `register`) before it reads or writes."""
    if check:
        check_workers(spark)
    spark.dataSource.register(RocketqDataSource)
    activate(spark)


__all__ = ["ARROW_SCHEMA", "SCHEMA", "SCHEMA_DDL", "SHORT_NAME", "RocketqDataSource", "WorkerPythonError", "register"]
