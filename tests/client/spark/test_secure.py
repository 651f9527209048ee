"""The source and the sink against a broker with authentication and authorization on: `accessKey`
and `secretKey` sign the driver's requests, each read task's pulls and the sink's producer; a
reader without them is refused with the broker's NO_PERMISSION remark."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from client.spark.queues import READER_GROUP
from tests.client.spark.conftest import BrokerThread
from tests.security_helpers import add_user, admin_api, secured_config

pytestmark = pytest.mark.timeout(300)
TOPIC = "spark_secure"
WRITER = {"accessKey": "spark-writer", "secretKey": "w-secret"}
READER = {"accessKey": "spark-reader", "secretKey": "r-secret"}


@pytest.fixture
def secured_broker(tmp_path: Path) -> Iterator[BrokerThread]:
    running = BrokerThread(tmp_path, secured_config(tmp_path, lenient=True))
    running.start()

    async def users() -> None:
        async with admin_api() as api:
            await api.create_topic(running.address, TOPIC, queue_nums=2)
        await add_user(running.address, WRITER["accessKey"], [(f"Topic:{TOPIC}", ["Pub"])], WRITER["secretKey"])
        await add_user(running.address, READER["accessKey"], [(f"Topic:{TOPIC}", ["Sub"]),
                                                              (f"Group:{READER_GROUP}", ["Sub"])], READER["secretKey"])
    asyncio.run(users())
    yield running
    running.stop()


def _read(spark: SparkSession, address: str, credentials: dict[str, str], streaming: bool = False) -> DataFrame:
    reader = (spark.readStream if streaming else spark.read).format("rocketq").option("endpoints", address)
    return reader.option("topic", TOPIC).options(**credentials).load()


def test_sink_batch_and_stream_reads_sign_with_their_credentials(spark: SparkSession, secured_broker: BrokerThread,
                                                                 tmp_path: Path) -> None:
    address = secured_broker.address
    rows = [(f"body-{i}".encode(), f"k{i}") for i in range(40)]
    df = spark.createDataFrame(rows, "body binary, keys string").repartition(2)
    df.write.format("rocketq").option("endpoints", address).option("topic", TOPIC).options(**WRITER) \
        .mode("append").save()
    assert sorted(bytes(r.body) for r in _read(spark, address, READER).collect()) == sorted(b for b, _ in rows)

    stream = _read(spark, address, {**READER, "startingOffsets": "earliest"}, streaming=True)
    query = (stream.select("body").writeStream.format("parquet")
             .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120) and query.exception() is None
    assert sorted(bytes(r.body) for r in spark.read.parquet(str(tmp_path / "out")).collect()) == sorted(
        b for b, _ in rows)

    with pytest.raises(Exception, match="authentication failed for an unsigned request"):
        _read(spark, address, {}).collect()
    with pytest.raises(Exception, match="User:spark-reader has no permission to Pub on Topic:spark_secure"):
        df.write.format("rocketq").option("endpoints", address).option("topic", TOPIC).options(**READER) \
            .mode("append").save()
