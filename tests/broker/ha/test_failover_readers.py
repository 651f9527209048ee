"""Readers keep their positions across an automatic failover (#39 "consumers (push, orderly, pull,
Spark) keep their positions"): a `PullConsumer` following the name server over a SYNC_MASTER, its
slave and a controller; the master is SIGKILLed while the consumer is half way through a backlog."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from chaos.ha_cluster import NAME, TOPIC, HACluster
from client import MessageQueue, PullConsumer
from conf.client import ClientConfig
from protocol.errors import ConnectionClosed, MQError
from tests.helpers import scrape_metrics

LEASE_MS = 1_500
GROUP = "ha_pull"


async def _committed_on(cluster: HACluster, address: str, queue_id: int) -> int:
    try:
        return await cluster.api.query_consumer_offset(address, GROUP, TOPIC, queue_id, 2_000)
    except (MQError, ConnectionClosed, OSError, TimeoutError):
        return -1


async def test_pull_consumer_keeps_its_committed_position_across_a_failover(tmp_path: Path) -> None:
    """A slow pull consumer commits, reads on (an uncommitted window of about 60 messages), and
    the master dies: the new master has the committed offsets (copied before the kill), the
    consumer goes on through the new master, every acknowledged message is read (none lost, each
    queue in order) and at most the uncommitted window is read twice; its next commit lands on the
    new master."""
    cluster = HACluster(tmp_path, lease_ms=LEASE_MS, namesrv=True, metrics=True)
    consumer = PullConsumer(GROUP, cluster.namesrv_addr, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            auto_commit=False, pull_batch_size=8, pull_threshold_for_queue=16,
                            client_config=ClientConfig(poll_route_interval_ms=200, rebalance_interval_ms=1_000))
    consumer.subscribe(TOPIC)
    consumed: list[tuple[int, str]] = []

    async def consume_until(done: int | set[str], timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while (len(consumed) < done if isinstance(done, int) else not done <= {b for _, b in consumed}):
                for message in await consumer.poll(200):
                    await asyncio.sleep(0.002)           # a slow application: 2 ms a message
                    consumed.append((message.queue_id, message.body.decode()))

    try:
        await cluster.start()
        info = await cluster.wait_in_sync(60)
        master, slave = info.master_id, 1 - info.master_id
        acked = [(i % 2, (await cluster.send_acked(f"before{i}", i % 2))[0]) for i in range(300)]
        await consumer.start()
        await consume_until(100, 30)
        await consumer.commit_sync()
        committed = {q: await consumer.committed(MessageQueue(TOPIC, NAME, q)) for q in (0, 1)}
        at_commit = len(consumed)
        assert sum(committed.values()) == at_commit
        async with asyncio.timeout(10):         # the slave has the offsets (the metadata stream)
            while [await _committed_on(cluster, cluster.address(slave), q) for q in (0, 1)] != [committed[0],
                                                                                                committed[1]]:
                await asyncio.sleep(0.05)
        await consume_until(at_commit + 60, 30)
        window = len(consumed) - at_commit + 2 * 16     # read since the commit, and what was buffered
        cluster.kill(master)
        acked += [(i % 2, (await cluster.send_acked(f"after{i}", i % 2))[0]) for i in range(100)]
        now = await cluster.replica_info()
        assert now is not None and now.master_id == slave
        for queue_id in (0, 1):
            assert await _committed_on(cluster, now.master_addr, queue_id) >= committed[queue_id]
        await consume_until({b for _, b in acked}, 60)
        duplicates = len(consumed) - len({b for _, b in consumed})
        assert duplicates <= window, f"{duplicates} read twice: more than the uncommitted window ({window})"
        for queue_id in (0, 1):
            firsts = list(dict.fromkeys(b for q, b in consumed if q == queue_id))
            assert firsts == [b for q, b in acked if q == queue_id]
        await consumer.commit_sync()
        for queue_id in (0, 1):
            assert await _committed_on(cluster, now.master_addr, queue_id) == 200
        # /metrics of the elected slave: master now, at the epoch the controller gave it
        text = await asyncio.to_thread(scrape_metrics, cluster.metrics_ports[slave])
        ha = {s.name: s.value for f in text_string_to_metric_families(text) if f.name.startswith("rocketq_ha_")
              for s in f.samples}
        assert ha["rocketq_ha_role"] == 1 and ha["rocketq_ha_epoch"] == now.epoch > info.epoch, ha
        assert ha["rocketq_ha_in_sync_replicas"] == 1           # the old master is down
    finally:
        await consumer.shutdown()
        await cluster.stop()
