"""Batch reads through `spark.read.format("rocketq")` against a real broker."""

from __future__ import annotations

import json
import time

import pytest
from pyspark.sql import DataFrame, SparkSession

from client.api import ClientAPI
from client.spark import SCHEMA
from protocol.message import Message, MessageExt, decode_message_batch
from tests.client.spark.conftest import BrokerThread, call, create_topic, send_messages
from tests.helpers import pull_header

pytestmark = pytest.mark.timeout(300)   # the first test also starts the JVM and Python workers
TOPIC = "spark_batch"


def _reader(spark: SparkSession, address: str, **options: str) -> DataFrame:
    reader = spark.read.format("rocketq").option("endpoints", address).option("topic", TOPIC)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _fill(address: str, per_queue: int = 30, queues: int = 3) -> None:
    create_topic(address, TOPIC, queues)
    for queue_id in range(queues):
        messages = [Message(TOPIC, f"{queue_id}:{i}".encode(), tags="even" if i % 2 == 0 else "odd",
                            keys=f"k{i}", properties={"n": str(i)}) for i in range(per_queue)]
        send_messages(address, TOPIC, messages, queue_id)


def next_millisecond() -> int:
    """Waits (bounded) until the clock is past the current millisecond, and returns the new one."""
    now_ms = time.time_ns() // 1_000_000
    deadline = time.monotonic() + 1.0
    while time.time_ns() // 1_000_000 <= now_ms:
        assert time.monotonic() < deadline, "the clock did not move for a second"
    return time.time_ns() // 1_000_000


def _offsets(df: DataFrame) -> list[tuple[int, int]]:
    return sorted((row.queue_id, row.queue_offset) for row in df.select("queue_id", "queue_offset").collect())


def test_reads_every_message_with_the_exact_schema(spark: SparkSession, broker_thread: BrokerThread) -> None:
    _fill(broker_thread.address)
    df = _reader(spark, broker_thread.address)
    assert df.schema == SCHEMA
    rows = df.collect()
    assert sorted((r.queue_id, r.queue_offset) for r in rows) == [(q, o) for q in range(3) for o in range(30)]
    row = next(r for r in rows if r.queue_id == 1 and r.queue_offset == 7)
    assert (row.topic, row.body, row.tags, row.keys) == (TOPIC, b"1:7", "odd", "k7")
    assert row.properties == {"n": "7"}
    stored = call(lambda api: _pull_one(api, broker_thread.address, 1, 7))
    assert row.msg_id == stored.msg_id
    assert row.store_timestamp.timestamp() * 1000 == stored.store_timestamp


async def _pull_one(api: ClientAPI, address: str, queue_id: int, queue_offset: int) -> MessageExt:
    _, body = await api.pull_message_raw(address, pull_header(topic=TOPIC, queue_id=queue_id,
                                                                   queue_offset=queue_offset, max_msg_nums=1), 5_000)
    return decode_message_batch(body)[0]


def test_reads_exact_offset_ranges_split_into_partitions(spark: SparkSession, broker_thread: BrokerThread) -> None:
    _fill(broker_thread.address)
    df = _reader(spark, broker_thread.address, startingOffsets=json.dumps({"0": 5, "1": -2, "2": 29}),
                 endingOffsets=json.dumps({"0": 12, "1": 3, "2": -1}), maxRecordsPerPartition="4")
    assert df.rdd.getNumPartitions() == 2 + 1 + 1    # queue 0: 7 offsets cut in 2, queue 1: 3, queue 2: 1
    assert _offsets(df) == [(0, o) for o in range(5, 12)] + [(1, 0), (1, 1), (1, 2), (2, 29)]
    assert _offsets(_reader(spark, broker_thread.address, startingOffsets="latest")) == []
    assert _offsets(_reader(spark, broker_thread.address, endingOffsets="earliest")) == []


def test_reads_from_a_timestamp(spark: SparkSession, broker_thread: BrokerThread) -> None:
    _fill(broker_thread.address, per_queue=5)
    cutoff_ms = next_millisecond()     # everything sent so far was stored before it, the rest after
    for queue_id in range(3):
        send_messages(broker_thread.address, TOPIC, [Message(TOPIC, b"later") for _ in range(4)], queue_id)
    df = _reader(spark, broker_thread.address, startingTimestamp=str(cutoff_ms))
    assert _offsets(df) == [(q, o) for q in range(3) for o in range(5, 9)]
    assert {r.body for r in df.collect()} == {b"later"}
    assert _offsets(_reader(spark, broker_thread.address, startingTimestamp=str(cutoff_ms + 3_600_000))) == []
    assert len(_offsets(_reader(spark, broker_thread.address, startingTimestamp="0"))) == 27


def test_tag_filter_is_evaluated_by_the_broker_and_rechecked(spark: SparkSession,
                                                             broker_thread: BrokerThread) -> None:
    _fill(broker_thread.address, per_queue=20, queues=2)
    df = _reader(spark, broker_thread.address, tags="odd", maxRecordsPerPartition="7")
    assert _offsets(df) == [(q, o) for q in range(2) for o in range(20) if o % 2 == 1]
    assert {r.tags for r in df.collect()} == {"odd"}
    assert _offsets(_reader(spark, broker_thread.address, tags="none || other")) == []


def test_sql_filter_is_evaluated_by_the_broker(spark: SparkSession, broker_thread: BrokerThread) -> None:
    _fill(broker_thread.address, per_queue=10, queues=2)
    df = _reader(spark, broker_thread.address, sql="n BETWEEN 3 AND 5 AND TAGS = 'odd'")
    assert _offsets(df) == [(q, o) for q in range(2) for o in (3, 5)]
    with pytest.raises(Exception, match=r"SUBSCRIPTION_PARSE_FAILED|parse"):
        _reader(spark, broker_thread.address, sql="n BETWEEN").collect()
