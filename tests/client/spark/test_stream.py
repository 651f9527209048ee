"""Structured Streaming reads through `spark.readStream.format("rocketq")`, written to Parquet file
sinks (the memory sink cannot restart from a checkpoint)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.headers import SendBatchMessageRequestHeader
from protocol.message import Message, encode_batch_body
from tests.client.spark.conftest import BrokerThread, call, create_topic, send_messages

pytestmark = pytest.mark.timeout(300)
TOPIC = "spark_stream"
QUERY_TIMEOUT_S = 120


def _fill(address: str, queues: int, per_queue: int, first: int = 0) -> None:
    for queue_id in range(queues):
        send_messages(address, TOPIC, [Message(TOPIC, f"{queue_id}:{i}".encode(), tags="t")
                                       for i in range(first, first + per_queue)], queue_id)


def _stream(spark: SparkSession, address: str, **options: str) -> DataFrame:
    reader = spark.readStream.format("rocketq").option("endpoints", address).option("topic", TOPIC)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().select("queue_id", "queue_offset", "body")


def _to_parquet(df: DataFrame, out: Path, checkpoint: Path, *, available_now: bool = True) -> StreamingQuery:
    writer = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")
    return writer.start()


def _finish(query: StreamingQuery) -> None:
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not stop by itself"
    assert query.exception() is None


def _rows(spark: SparkSession, out: Path) -> list[tuple[int, int, bytes]]:
    return sorted((r.queue_id, r.queue_offset, bytes(r.body)) for r in spark.read.parquet(str(out)).collect())


def _batch_sizes(query: StreamingQuery) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


class Sender:
    """Keeps sending 8-message batches to the queues in turn from a thread, one every 50 ms (the
    offered load's pacing, not a synchronisation), until stopped."""

    def __init__(self, address: str, queues: int) -> None:
        self._address, self._queues = address, queues
        self._stop = threading.Event()
        self.batches = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        remoting = RemotingClient()
        api = ClientAPI(remoting)
        try:
            while not self._stop.is_set():
                queue_id = self.batches % self._queues
                header = SendBatchMessageRequestHeader(producer_group="spark-tests", topic=TOPIC, queue_id=queue_id)
                body = encode_batch_body([Message(TOPIC, b"more", tags="t") for _ in range(8)])
                await api.send_batch(self._address, header, body)
                self.batches += 1
                await asyncio.sleep(0.05)
        finally:
            await remoting.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def __enter__(self) -> Sender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def _max_offsets(address: str, queues: int) -> list[int]:
    async def work(api: ClientAPI) -> list[int]:
        return [await api.get_max_offset(address, TOPIC, q) for q in range(queues)]

    return call(work)


def test_available_now_stops_at_the_start_time_latest_while_messages_keep_coming(
        spark: SparkSession, broker_thread: BrokerThread, tmp_path: Path) -> None:
    address = broker_thread.address
    create_topic(address, TOPIC, 2)
    _fill(address, 2, 150)
    with Sender(address, 2) as sender:
        query = _to_parquet(_stream(spark, address, startingOffsets="earliest", maxRecordsPerTrigger="300",
                                    commitToGroup="spark-progress"), tmp_path / "out", tmp_path / "checkpoint")
        _finish(query)
        batches_sent_while_running = sender.batches
        assert sender.running     # the query stopped by itself, not for want of new messages
    rows = _rows(spark, tmp_path / "out")
    per_queue = {q: [o for qq, o, _ in rows if qq == q] for q in range(2)}
    assert all(offsets == list(range(len(offsets))) for offsets in per_queue.values())   # no gap, no duplicate
    assert all(len(offsets) >= 150 for offsets in per_queue.values())
    sizes = _batch_sizes(query)
    assert len(sizes) >= 2 and max(sizes) <= 300 and sum(sizes) == len(rows)
    assert batches_sent_while_running > 0 and sum(_max_offsets(address, 2)) > len(rows)
    committed = call(lambda api: asyncio.gather(*(api.query_consumer_offset(address, "spark-progress", TOPIC, q)
                                                  for q in range(2))))
    # Spark commits a batch's offsets to the source when it plans the next batch: the group trails by one
    assert sum(committed) == len(rows) - sizes[-1] and all(0 < c <= len(per_queue[q]) for q, c in enumerate(committed))


def test_a_restarted_query_goes_on_from_its_checkpoint_and_picks_up_new_queues(
        spark: SparkSession, broker_thread: BrokerThread, tmp_path: Path) -> None:
    address = broker_thread.address
    create_topic(address, TOPIC, 2)
    _fill(address, 2, 20)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _finish(_to_parquet(_stream(spark, address, startingOffsets="earliest"), out, checkpoint))
    assert len(_rows(spark, out)) == 40
    create_topic(address, TOPIC, 3)       # a third queue
    _fill(address, 3, 5, first=20)
    _finish(_to_parquet(_stream(spark, address, startingOffsets="earliest"), out, checkpoint))
    rows = _rows(spark, out)
    assert [(q, o) for q, o, _ in rows] == ([(0, o) for o in range(25)] + [(1, o) for o in range(25)]
                                            + [(2, o) for o in range(5)])


def test_a_query_stopped_midway_and_restarted_writes_what_an_uninterrupted_one_writes(
        spark: SparkSession, broker_thread: BrokerThread, tmp_path: Path) -> None:
    address = broker_thread.address
    create_topic(address, TOPIC, 3)
    _fill(address, 3, 200)
    options = {"startingOffsets": "earliest", "maxRecordsPerTrigger": "100"}
    whole = _to_parquet(_stream(spark, address, **options), tmp_path / "whole", tmp_path / "whole-checkpoint")
    _finish(whole)
    interrupted = _to_parquet(_stream(spark, address, **options), tmp_path / "parts", tmp_path / "parts-checkpoint",
                              available_now=False)
    _wait_for_batches(interrupted, 2)
    interrupted.stop()                    # mid-way: 600 offsets take 6 batches of 100
    done_before_stop = sum(_batch_sizes(interrupted))
    assert 0 < done_before_stop < 600
    _finish(_to_parquet(_stream(spark, address, **options), tmp_path / "parts", tmp_path / "parts-checkpoint"))
    expected = _rows(spark, tmp_path / "whole")
    assert len(expected) == 600
    assert _rows(spark, tmp_path / "parts") == expected


def _wait_for_batches(query: StreamingQuery, count: int) -> None:
    """Block (bounded) until `query` has completed `count` micro-batches that read rows."""
    for _ in _until(QUERY_TIMEOUT_S):
        if len(_batch_sizes(query)) >= count:
            return
        assert query.isActive, f"query stopped: {query.exception()}"
    raise AssertionError(f"{count} micro-batches did not complete within {QUERY_TIMEOUT_S} s")


def _until(timeout_s: float) -> Iterator[None]:
    """Yields on each poll (every 50 ms) until `timeout_s` passed; callers assert on exhaustion."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        yield
        time.sleep(0.05)
