"""`rocketq admin broker status` against a real broker."""

from __future__ import annotations

from pathlib import Path

from broker.broker import Broker
from client.api import ClientAPI
from client.pop_api import PopAPI
from client.remoting.remoting_client import RemotingClient
from protocol.headers_v5 import PopMessageRequestHeader
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.conftest import broker_config
from tests.helpers import pull_header, send


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


async def test_broker_status_counts_messages_in_and_out_pulls_and_pops(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, default_queue_nums=1)) as broker:
        for i in range(6):
            await send(client_api, broker.address, "flow", b"m%d" % i)
        pulled = await client_api.pull_message(broker.address, pull_header(topic="flow", max_msg_nums=4), 3_000)
        remoting = RemotingClient()
        try:
            popped = await PopAPI(remoting).pop_message(broker.address, PopMessageRequestHeader(
                consumer_group="poppers", topic="flow", queue_id=-1, max_msg_nums=3, invisible_time=60_000,
                poll_time=0), 3_000)
        finally:
            await remoting.close()
        assert len(pulled.messages) == 4 and len(popped) == 3
        info = await rocketq_json("admin", "broker", "status", "--endpoints", broker.address)
        assert info["msg_put_total"] == 6 and info["msg_get_total"] == 7
        assert info["put_tps"] > 0 and info["get_tps"] > 0        # since the start: well under 10 s ago
        text = await rocketq("admin", "broker", "status", "--endpoints", broker.address)
    assert "messages in / out" in text.output and "6 / 7 since" in text.output
