"""Options `accessKey`, `secretKey` and `caFile` on a secured cluster (issue 41): a name server and
two brokers with authentication, authorization and TLS (enforcing) on; the sink and the source
reach them through the name server, signing and encrypting every request, to every server."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import SparkSession

from client.spark.queues import READER_GROUP
from conf.devcerts import CertFiles
from tests.secured_cluster import SecuredCluster, secured_cluster

pytestmark = pytest.mark.timeout(300)
T = TypeVar("T")
TOPIC = "c_secure"
WRITER = {"accessKey": "cluster-writer", "secretKey": "w-secret"}
READER = {"accessKey": "cluster-reader", "secretKey": "r-secret"}


class LoopThread:
    """An event loop in a daemon thread, for the in-process cluster while Spark blocks the test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="secured-cluster", daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(60)
        self.loop.close()


@pytest.fixture
def secured(tmp_path: Path, tls_certs: CertFiles) -> Iterator[SecuredCluster]:
    runner = LoopThread()
    context = secured_cluster(tmp_path, tls_certs)
    cluster = runner.run(context.__aenter__())
    try:
        runner.run(cluster.create_topic(TOPIC, 2))
        runner.run(cluster.add_user(WRITER["accessKey"], WRITER["secretKey"], [(f"Topic:{TOPIC}", ["Pub"])]))
        runner.run(cluster.add_user(READER["accessKey"], READER["secretKey"],
                                    [(f"Topic:{TOPIC}", ["Sub"]), (f"Group:{READER_GROUP}", ["Sub"])]))
        yield cluster
    finally:
        runner.run(context.__aexit__(None, None, None))
        runner.close()


def test_writes_and_reads_sign_and_encrypt_towards_the_name_server_and_each_broker(
        spark: SparkSession, secured: SecuredCluster) -> None:
    tls = {"caFile": secured.certs.ca_file}
    endpoint = secured.endpoint
    bodies = [f"row-{n}".encode() for n in range(200)]
    (spark.createDataFrame([(b,) for b in bodies], "body binary").repartition(2).write.format("rocketq")
     .option("endpoints", endpoint).option("topic", TOPIC).options(**WRITER, **tls).mode("append").save())
    rows = (spark.read.format("rocketq").option("endpoints", endpoint).option("topic", TOPIC)
            .options(**READER, **tls).load().select("broker_name", "body").collect())
    assert sorted(bytes(r.body) for r in rows) == sorted(bodies)
    assert set(Counter(r.broker_name for r in rows)) == {"broker-a", "broker-b"}
    with pytest.raises(Exception, match="authentication failed for an unsigned request"):
        spark.read.format("rocketq").option("endpoints", endpoint).option("topic", TOPIC).options(**tls).load() \
            .collect()
