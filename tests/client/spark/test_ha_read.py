"""A streaming read across an HA failover (issue 41 with issue 39): a Structured Streaming query
reads a topic through the name server from a SYNC_MASTER with a slave under a controller; the
master is SIGKILLed mid-query; the slave is elected, and the query goes on from the same queue
offsets (the replica set keeps its broker name and its offsets): every acknowledged message is
read exactly once."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from chaos.ha_cluster import TOPIC, HACluster
from tests.client.spark.test_cluster_read import _select, _to_parquet
from tests.client.spark.test_cluster_secure import LoopThread
from tests.client.spark.test_stream import QUERY_TIMEOUT_S, _until, _wait_for_batches

pytestmark = pytest.mark.timeout(300)


def test_a_streaming_read_across_an_ha_failover_reads_every_acknowledged_message_once(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(Path(__file__).parents[3])          # the brokers run this checkout
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    loop = LoopThread()

    async def make() -> HACluster:
        return HACluster(tmp_path / "ha", lease_ms=1_500, namesrv=True,
                         broker_settings={"register_name_server_period_ms": "500"})
    cluster = loop.run(make())

    async def send(prefix: str, count: int) -> list[str]:
        return [(await cluster.send_acked(f"{prefix}{i}", i % 2))[0] for i in range(count)]

    try:
        loop.run(cluster.start())
        info = loop.run(cluster.wait_in_sync(60))
        acked = loop.run(send("before", 100))
        reader = (spark.readStream.format("rocketq").option("endpoints", cluster.namesrv_addr).option("topic", TOPIC)
                  .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "40")
                  .option("brokerWaitTimeoutMs", "60000"))
        out = tmp_path / "out"
        query = _to_parquet(_select(reader.load()), out, available_now=False)
        _wait_for_batches(query, 1)
        cluster.kill(info.master_id)
        acked += loop.run(send("after", 60))
        for _ in _until(QUERY_TIMEOUT_S):
            assert query.isActive, f"query stopped: {query.exception()}"
            if sum(p["numInputRows"] for p in query.recentProgress) >= len(acked):
                break
        query.stop()
        read = Counter(bytes(r.body).decode() for r in spark.read.parquet(str(out)).collect())
        assert {body: read[body] for body in acked if read[body] != 1} == {}
    finally:
        loop.run(cluster.stop())
        loop.close()
