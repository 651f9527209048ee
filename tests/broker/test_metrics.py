"""Prometheus metrics: RocketMQ 5's names, scraped over HTTP from a running broker."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from broker.broker import Broker
from client.api import ClientAPI
from tests.conftest import broker_config
from tests.helpers import pull_header, send


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def test_metrics_count_messages_in_and_out(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, metrics_port=_free_port())) as broker:
        for body in (b"ab", b"cde"):
            await send(client_api, broker.address, "m", body)
        await client_api.pull_message(broker.address, pull_header(topic="m", group="mg"), 3_000)
        assert broker.metrics_port is not None
        text = await asyncio.to_thread(_scrape, broker.metrics_port)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    node = (("cluster", "DefaultCluster"), ("node_id", "broker-a"))

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted((*node, *labels.items()))))]

    assert value("rocketmq_messages_in_total", topic="m") == 2
    assert value("rocketmq_throughput_in_total", topic="m") == 5
    assert value("rocketmq_messages_out_total", topic="m", consumer_group="mg") == 2
    assert value("rocketmq_rpc_latency_count", request_code="10", response_code="0") == 2
    assert value("rocketmq_rpc_latency_count", request_code="11", response_code="0") == 1
    assert value("rocketq_held_pulls") == 0
