"""Writes through `df.write.format("rocketq")`, read back through the source."""

from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from tests.client.spark.conftest import BrokerThread, create_topic

pytestmark = pytest.mark.timeout(300)   # the first test also starts the JVM and Python workers
TOPIC = "spark_sink"


def test_round_trip_keeps_every_column_and_gives_deterministic_uniq_keys(spark: SparkSession,
                                                                        broker_thread: BrokerThread) -> None:
    address = broker_thread.address
    create_topic(address, TOPIC, 4)
    rows = [(f"body-{i}".encode(), "even" if i % 2 == 0 else "odd", f"key{i}", {"n": str(i)},
             i % 4 if i % 3 == 0 else None) for i in range(100)]
    df = spark.createDataFrame(rows, "body binary, tags string, keys string, properties map<string,string>, "
                                     "queue_id int").repartition(3)
    df.write.format("rocketq").option("endpoints", address).option("topic", TOPIC).mode("append").save()
    back = spark.read.format("rocketq").option("endpoints", address).option("topic", TOPIC).load().collect()
    assert len(back) == 100
    by_body = {r.body: r for r in back}
    for body, tags, keys, properties, queue_id in rows:
        row = by_body[body]
        assert (row.tags, row.keys, row.properties["n"]) == (tags, keys, properties["n"])
        if queue_id is not None:
            assert row.queue_id == queue_id
    uniq_keys = [r.properties["UNIQ_KEY"] for r in back]
    assert len(set(uniq_keys)) == 100
    job_ids = {key.rsplit("-", 3)[0] for key in uniq_keys}
    assert len(job_ids) == 1        # <job>-0-<partition>-<row>: one job
    assert {key.rsplit("-", 3)[1] for key in uniq_keys} == {"0"}


def test_string_bodies_and_a_missing_body_column(spark: SparkSession, broker_thread: BrokerThread) -> None:
    address = broker_thread.address
    df = spark.createDataFrame([("hello",), ("world",)], "body string")
    df.write.format("rocketq").option("endpoints", address).option("topic", TOPIC).mode("append").save()
    back = spark.read.format("rocketq").option("endpoints", address).option("topic", TOPIC).load()
    assert sorted(r.body for r in back.collect()) == [b"hello", b"world"]
    with pytest.raises(AnalysisException, match="body"):
        (spark.createDataFrame([("x",)], "text string").write.format("rocketq").option("endpoints", address)
         .option("topic", TOPIC).mode("append").save())
