"""HA figures on /metrics, scraped over HTTP from a master and its slave running in this process."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from broker.broker import Broker
from client.api import ClientAPI
from tests.broker.ha.test_replication import slave_caught_up
from tests.conftest import broker_config
from tests.helpers import free_port, scrape_metrics, send, wait_until


async def _ha_samples(broker: Broker) -> dict[tuple[str, str], float]:
    """(metric name, slave label or "") -> value of every rocketq_ha_* sample."""
    assert broker.metrics_port is not None
    text = await asyncio.to_thread(scrape_metrics, broker.metrics_port)
    return {(sample.name, sample.labels.get("slave", "")): sample.value
            for family in text_string_to_metric_families(text) if family.name.startswith("rocketq_ha_")
            for sample in family.samples}


async def test_master_and_slave_report_role_acks_lag_and_in_sync_replicas(tmp_path: Path,
                                                                          client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path / "master", broker_role="SYNC_MASTER", metrics_port=free_port(),
                                    ha_slave_sync_interval_ms=50)) as master:
        assert master.replication is not None and master.store is not None
        alone = await _ha_samples(master)
        assert alone[("rocketq_ha_role", "")] == 1 and alone[("rocketq_ha_in_sync_replicas", "")] == 1
        assert alone[("rocketq_ha_epoch", "")] == 0
        assert not any(name == "rocketq_ha_slave_ack_offset" for name, _ in alone)
        async with Broker(broker_config(tmp_path / "slave", broker_role="SLAVE", broker_id=1, metrics_port=free_port(),
                                        ha_master_address=f"127.0.0.1:{master.replication.ha_address_port}")) as slave:
            await wait_until(lambda: master.replication is not None and master.replication.server is not None
                             and master.replication.server.in_sync_slaves() == {1}, what="slave in sync")
            for i in range(20):
                await send(client_api, master.address, "ha_metrics", f"m{i}".encode())
            await slave_caught_up(master, slave)
            end = master.store.commit_log_max_offset()
            seen = await _ha_samples(master)
            assert seen[("rocketq_ha_in_sync_replicas", "")] == 2
            assert seen[("rocketq_ha_slave_ack_offset", "1")] == end      # SYNC_MASTER: acked before answering
            assert seen[("rocketq_ha_slave_lag_bytes", "1")] == 0
            following = await _ha_samples(slave)
            assert following[("rocketq_ha_role", "")] == 0
            assert following[("rocketq_ha_master_lag_bytes", "")] == 0
            assert not any(name == "rocketq_ha_in_sync_replicas" for name, _ in following)
        # the slave stopped: its row goes, the master is alone in sync again
        await wait_until(lambda: master.replication is not None and master.replication.server is not None
                         and not master.replication.server.in_sync_slaves(), what="slave gone")
        gone = await _ha_samples(master)
        assert gone[("rocketq_ha_in_sync_replicas", "")] == 1
        assert ("rocketq_ha_slave_ack_offset", "1") not in gone
