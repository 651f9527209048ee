"""Exactly-once writes to a topic on two brokers (issue 41): a write task that fails after sending
part of its rows and is retried, and a streaming query killed mid-batch and restarted from its
checkpoint, each leave every row stored once (the sink's deterministic UNIQ_KEYs + DEDUP, and the
brokers' `store.dedup_window_ms`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from client.api import ClientAPI
from client.spark.queues import run_on_private_loop
from tests.client.spark.cluster import SparkCluster
from tests.client.spark.test_cluster_read import fill
from tests.client.spark.test_stream import QUERY_TIMEOUT_S

pytestmark = pytest.mark.timeout(300)
ROWS = 300
ROWS_PER_BATCH = 100      # spark.sql.execution.arrow.maxRecordsPerBatch in these tests
STORED_TIMEOUT_S = 60.0


def _stored_count(addresses: list[str], topic: str) -> int:
    async def work(api: ClientAPI) -> int:
        return sum([await api.get_max_offset(a, topic, q) for a in addresses for q in range(2)])

    return run_on_private_loop(work)


def failing_after_first_batch(addresses: list[str], topic: str,
                              fails: Callable[[TaskContext], bool]) -> Callable[[Iterator[pa.RecordBatch]],
                                                                             Iterator[pa.RecordBatch]]:
    """A mapInArrow function passing its batches through; in a task where `fails(context)`, once
    it passed `ROWS_PER_BATCH` rows (the sink's first Arrow batch) it waits (bounded) until the
    brokers stored that many rows of `topic` — the sink sent them — then raises."""
    def passing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time
        context, passed = TaskContext.get(), 0
        for batch in batches:
            yield batch
            before, passed = passed, passed + batch.num_rows
            if before < ROWS_PER_BATCH <= passed and context is not None and fails(context):
                deadline = time.monotonic() + STORED_TIMEOUT_S
                while _stored_count(addresses, topic) < ROWS_PER_BATCH:
                    assert time.monotonic() < deadline, "the sink did not send the first batch"
                    time.sleep(0.05)
                raise RuntimeError(f"failing attempt {context.attemptNumber()} after sending a batch")
    return passing


def _read_back(spark: SparkSession, cluster: SparkCluster, topic: str) -> list[bytes]:
    df = spark.read.format("rocketq").option("endpoints", cluster.namesrv).option("topic", topic).load()
    rows = df.select("body", "properties").collect()
    assert len({r.properties["UNIQ_KEY"] for r in rows}) == len(rows)
    return sorted(bytes(r.body) for r in rows)


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key) or "10000"
    spark.conf.set(key, str(ROWS_PER_BATCH))
    yield
    spark.conf.set(key, before)


def _bodies(spark: SparkSession) -> DataFrame:
    return spark.range(ROWS, numPartitions=1).selectExpr("cast(cast(id as string) as binary) as body")


def test_a_write_task_that_fails_once_after_sending_part_of_its_rows_stores_each_row_once(
        spark: SparkSession, cluster: SparkCluster, small_arrow_batches: None) -> None:
    topic = "c_sink_retry"
    cluster.create_topic(topic, 2)
    addresses = [b.address for b in cluster.brokers.values()]
    passing = failing_after_first_batch(addresses, topic, lambda context: context.attemptNumber() == 0)
    (_bodies(spark).mapInArrow(passing, "body binary").write.format("rocketq")
     .option("endpoints", cluster.namesrv).option("topic", topic).mode("append").save())
    assert _read_back(spark, cluster, topic) == sorted(str(n).encode() for n in range(ROWS))
    per_broker = Counter(r.broker_name for r in spark.read.format("rocketq").option("endpoints", cluster.namesrv)
                         .option("topic", topic).load().select("broker_name").collect())
    assert set(per_broker) == {"broker-a", "broker-b"}       # rows without a queue_id go to every broker


def test_a_streaming_sink_killed_mid_batch_and_restarted_stores_each_row_once(
        spark: SparkSession, cluster: SparkCluster, small_arrow_batches: None, tmp_path: Path) -> None:
    source, sink = "c_sink_src", "c_sink_dst"
    cluster.create_topic(source, 2)
    cluster.create_topic(sink, 2)
    fill(cluster, source, 2, ROWS // 4)
    addresses = [b.address for b in cluster.brokers.values()]

    def run(fails: bool) -> None:
        def passing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            """In the first run, task 1 waits (bounded) until task 0 has sent rows, then fails (each
            attempt): the job, and the query, die with part of the micro-batch written."""
            import time
            context = TaskContext.get()
            if fails and context is not None and context.partitionId() == 1:
                deadline = time.monotonic() + STORED_TIMEOUT_S
                while _stored_count(addresses, sink) == 0:
                    assert time.monotonic() < deadline, "task 0 did not send"
                    time.sleep(0.05)
                raise RuntimeError(f"failing attempt {context.attemptNumber()} of task 1")
            yield from batches

        df = (spark.readStream.format("rocketq").option("endpoints", cluster.namesrv).option("topic", source)
              .option("startingOffsets", "earliest").load().select("body").coalesce(2)
              .mapInArrow(passing, "body binary"))
        query = (df.writeStream.format("rocketq").option("endpoints", cluster.namesrv).option("topic", sink)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        if fails:
            with pytest.raises(StreamingQueryException, match="failing attempt 1 of task 1"):
                query.awaitTermination(QUERY_TIMEOUT_S)
        else:
            assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not stop by itself"
            assert query.exception() is None

    run(fails=True)           # task 0 wrote its rows, task 1 failed: the query dies mid-batch
    assert 0 < _stored_count(addresses, sink) < ROWS
    run(fails=False)          # restarted from the checkpoint: the same micro-batch again, same UNIQ_KEYs
    expected = sorted(f"{b}:{q}:{n}".encode() for b in cluster.brokers for q in range(2) for n in range(ROWS // 4))
    assert _read_back(spark, cluster, sink) == expected
