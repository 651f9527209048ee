"""`rocketq admin broker status` against a real broker."""

from __future__ import annotations

from pathlib import Path

from broker.broker import Broker
from client.api import ClientAPI
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.conftest import broker_config
from tests.helpers import send


async def test_broker_status_shows_store_disk_connections_and_config_diff(tmp_path: Path,
                                                                          client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, default_queue_nums=2)) as broker:
        await send(client_api, broker.address, "st", b"x" * 100)
        info = await rocketq_json("admin", "broker", "status", "--endpoints", broker.address)
        assert info["broker_name"] == "broker-a" and info["address"] == broker.address
        assert info["commit_log_max_offset"] > 100 and info["store_bytes"] > 0
        assert 0 < info["disk_used_ratio"] <= 1 and info["disk_free_bytes"] > 0
        assert info["connections"] >= 1 and info["topic_count"] == 1 and info["held_pulls"] == 0
        assert info["config_diff"]["default_queue_nums"] == ["4", "2"]
        assert info["config_diff"]["metrics_port"] == ["5557", "0"]
        assert "listen_host" not in info["config_diff"]
        text = await rocketq("admin", "brokerStatus", "--endpoints", broker.address)
    assert text.exit_code == 0
    for expected in ("uptime", "disk", "held pulls", "connections", "default_queue_nums"):
        assert expected in text.output
