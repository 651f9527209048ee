"""Reads and writes from a thread other than the one that created the session: Spark looks a
Python data source up through the calling thread's active session, which PySpark sets only in the
thread that created it. `local_session` and `register` make it active in their thread, `activate`
in any other (found running `spark_cluster_read` and `spark_sink_dedup` in one process: the second
one's writes failed with DATA_SOURCE_NOT_FOUND)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
from pyspark.sql import SparkSession

from client.spark.session import activate, local_session
from protocol.message import Message
from tests.client.spark.conftest import BrokerThread, create_topic, send_messages

pytestmark = pytest.mark.timeout(300)
TOPIC = "spark_threads"
T = TypeVar("T")


def _in_new_thread(work: Callable[[], T]) -> T:
    """`work()` in a thread of its own (a new JVM thread for PySpark), its result or its exception."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:        # handed back to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(240)
    assert outcome, "the thread did not finish"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]  # type: ignore[return-value]


def _count(spark: SparkSession, address: str) -> int:
    return spark.read.format("rocketq").option("endpoints", address).option("topic", TOPIC).load().count()


def test_another_thread_reads_and_writes_after_activate_or_local_session(spark: SparkSession,
                                                                       broker_thread: BrokerThread) -> None:
    address = broker_thread.address
    create_topic(address, TOPIC, 2)
    send_messages(address, TOPIC, [Message(TOPIC, b"m%d" % i) for i in range(10)], 0)

    def activated_count() -> int:
        activate(spark)
        return _count(spark, address)

    def session_then_count() -> int:
        return _count(local_session("rocketq-tests"), address)     # the running session, made active here

    def activated_write() -> int:
        activate(spark)
        (spark.range(5).selectExpr("cast(id as string) as body").write.format("rocketq")
         .option("endpoints", address).option("topic", TOPIC).mode("append").save())
        return _count(spark, address)

    assert _in_new_thread(activated_count) == 10
    assert _in_new_thread(session_then_count) == 10
    assert _in_new_thread(activated_write) == 15
