"""Reads of a topic served by two brokers, found through a name server (issue 41): batch, streaming,
a query restarted from its checkpoint (also one written in the legacy one-broker offset form), and
a broker SIGKILLed during a streaming query."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from client.api import ClientAPI
from protocol.headers import SendBatchMessageRequestHeader
from protocol.message import Message, encode_batch_body
from tests.client.spark.cluster import BROKERS, SparkCluster
from tests.client.spark.test_stream import QUERY_TIMEOUT_S, _finish, _until, _wait_for_batches

pytestmark = pytest.mark.timeout(300)
Row = tuple[str, int, int, bytes]


def fill(cluster: SparkCluster, topic: str, queues: int, per_queue: int, first: int = 0,
         brokers: tuple[str, ...] = BROKERS) -> None:
    """`per_queue` messages "<broker>:<queue>:<n>" into every queue of each of `brokers`."""
    async def work(api: ClientAPI) -> None:
        for name in brokers:
            for queue_id in range(queues):
                header = SendBatchMessageRequestHeader(producer_group="spark-tests", topic=topic, queue_id=queue_id)
                body = encode_batch_body([Message(topic, f"{name}:{queue_id}:{n}".encode())
                                          for n in range(first, first + per_queue)])
                await api.send_batch(cluster.brokers[name].address, header, body)

    cluster.call(work)


def _select(df: DataFrame) -> DataFrame:
    return df.select("broker_name", "queue_id", "queue_offset", "body")


def _rows(df: DataFrame) -> list[Row]:
    return sorted((r.broker_name, r.queue_id, r.queue_offset, bytes(r.body)) for r in df.collect())


def expected(queues: int, per_queue: int, brokers: tuple[str, ...] = BROKERS) -> list[Row]:
    return sorted((b, q, n, f"{b}:{q}:{n}".encode()) for b in brokers for q in range(queues) for n in range(per_queue))


def _stream(spark: SparkSession, cluster: SparkCluster, topic: str, **options: str) -> DataFrame:
    reader = spark.readStream.format("rocketq").option("endpoints", cluster.namesrv).option("topic", topic)
    for key, value in {"startingOffsets": "earliest", **options}.items():
        reader = reader.option(key, value)
    return _select(reader.load())


def _to_parquet(df: DataFrame, out: Path, *, available_now: bool = True) -> StreamingQuery:
    writer = (df.writeStream.format("parquet").option("path", str(out))
              .option("checkpointLocation", str(out.with_name(out.name + "-checkpoint"))))
    return (writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")).start()


def test_a_batch_read_through_the_name_server_returns_every_message_of_both_brokers_once(
        spark: SparkSession, cluster: SparkCluster) -> None:
    cluster.create_topic("c_batch", 2)
    fill(cluster, "c_batch", 2, 40)
    df = (spark.read.format("rocketq").option("endpoints", cluster.namesrv).option("topic", "c_batch")
          .option("maxRecordsPerPartition", "15").load())
    assert _rows(_select(df)) == expected(2, 40)
    ending = json.dumps({"broker-b": {"1": 5}, "broker-a": {"0": 3, "1": 0}})
    some = _rows(_select(spark.read.format("rocketq").option("endpoints", cluster.namesrv).option("topic", "c_batch")
                         .option("endingOffsets", ending).load()))
    assert Counter((b, q) for b, q, _, _ in some) == {("broker-a", 0): 3, ("broker-b", 1): 5, ("broker-b", 0): 40}
    with pytest.raises(Exception, match="served by 2 brokers"):
        spark.read.format("rocketq").option("endpoints", cluster.namesrv).option("topic", "c_batch") \
            .option("startingOffsets", '{"0": 1}').load().collect()


def test_a_stream_stopped_and_restarted_reads_both_brokers_once_and_a_joining_broker_from_its_start(
        spark: SparkSession, cluster: SparkCluster, tmp_path: Path) -> None:
    topic = "c_stream"
    cluster.call(lambda api: api.create_topic(cluster.brokers["broker-a"].address, topic, queue_nums=2))
    fill(cluster, topic, 2, 150, brokers=("broker-a",))
    query = _to_parquet(_stream(spark, cluster, topic, maxRecordsPerTrigger="100"), tmp_path / "out",
                        available_now=False)
    _wait_for_batches(query, 1)
    query.stop()
    cluster.create_topic(topic, 2)                  # broker-b joins the route with messages already stored
    fill(cluster, topic, 2, 30, brokers=("broker-b",))
    fill(cluster, topic, 2, 20, first=150, brokers=("broker-a",))
    _finish(_to_parquet(_stream(spark, cluster, topic, maxRecordsPerTrigger="100"), tmp_path / "out"))
    rows = _rows(spark.read.parquet(str(tmp_path / "out")))
    assert rows == sorted(expected(2, 170, ("broker-a",)) + expected(2, 30, ("broker-b",)))


def _legacy_checkpoint(checkpoint: Path) -> None:
    """Rewrites the source offsets of every offset-log entry in the one-level form the source wrote
    before it read several brokers ({"<queue_id>": offset}); drops the checksums Spark would check."""
    for entry in (checkpoint / "offsets").iterdir():
        if entry.name.endswith(".crc"):
            entry.unlink()
            continue
        lines = entry.read_text().splitlines()
        (only,) = json.loads(lines[-1]).values()
        lines[-1] = json.dumps(only)
        entry.write_text("\n".join(lines))


def test_a_checkpoint_in_the_legacy_offset_form_restarts_on_a_one_broker_topic(
        spark: SparkSession, cluster: SparkCluster, tmp_path: Path) -> None:
    topic = "c_legacy"
    cluster.call(lambda api: api.create_topic(cluster.brokers["broker-a"].address, topic, queue_nums=2))
    fill(cluster, topic, 2, 30, brokers=("broker-a",))
    _finish(_to_parquet(_stream(spark, cluster, topic), tmp_path / "out"))
    _legacy_checkpoint(tmp_path / "out-checkpoint")
    fill(cluster, topic, 2, 10, first=30, brokers=("broker-a",))
    _finish(_to_parquet(_stream(spark, cluster, topic), tmp_path / "out"))
    assert _rows(spark.read.parquet(str(tmp_path / "out"))) == expected(2, 40, ("broker-a",))


def test_a_broker_killed_during_a_streaming_query_delays_it_then_everything_arrives_once(
        spark: SparkSession, cluster: SparkCluster, tmp_path: Path) -> None:
    topic = "c_kill"
    cluster.create_topic(topic, 2)
    fill(cluster, topic, 2, 50)
    query = _to_parquet(_stream(spark, cluster, topic, maxRecordsPerTrigger="40", brokerWaitTimeoutMs="60000"),
                        tmp_path / "out", available_now=False)
    _wait_for_batches(query, 1)
    cluster.kill("broker-b")
    fill(cluster, topic, 2, 10, first=50, brokers=("broker-a",))
    restarted = threading.Timer(2.0, cluster.restart, args=("broker-b",))   # down for 2 s while batches run
    restarted.start()
    try:
        for _ in _until(QUERY_TIMEOUT_S):
            assert query.isActive, f"query stopped: {query.exception()}"
            if sum(p["numInputRows"] for p in query.recentProgress) >= 60 * 2 + 50 * 2:
                break
    finally:
        restarted.join()
    fill(cluster, topic, 2, 5, first=50, brokers=("broker-b",))
    want = sorted(expected(2, 60, ("broker-a",)) + expected(2, 55, ("broker-b",)))
    for _ in _until(QUERY_TIMEOUT_S):
        assert query.isActive, f"query stopped: {query.exception()}"
        if len(query.recentProgress) and query.lastProgress and \
                sum(p["numInputRows"] for p in query.recentProgress) >= len(want):
            break
    query.stop()
    assert _rows(spark.read.parquet(str(tmp_path / "out"))) == want
