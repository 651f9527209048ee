"""Prometheus metrics: RocketMQ 5's names, scraped over HTTP from a running broker."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.broker import Broker
from client.api import ClientAPI
from conf.broker import BrokerConfig
from protocol.clock import ManualClock
from tests.conftest import broker_config
from tests.helpers import free_port, pull_header, scrape_metrics, send


async def test_metrics_count_messages_in_and_out(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, metrics_port=free_port())) as broker:
        for body in (b"ab", b"cde"):
            await send(client_api, broker.address, "m", body)
        await client_api.pull_message(broker.address, pull_header(topic="m", group="mg"), 3_000)
        assert broker.metrics_port is not None
        text = await asyncio.to_thread(scrape_metrics, broker.metrics_port)
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


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_lag_inflight_ready_and_latency_are_computed_at_scrape(tmp_path: Path, client_api: ClientAPI) -> None:
    clock = ManualClock()
    async with Broker(broker_config(tmp_path), clock=clock) as broker:
        for body in (b"a", b"b", b"c", b"d", b"e"):
            await send(client_api, broker.address, "lag", body)
            clock.advance(1_000)
        await client_api.update_consumer_offset(broker.address, "lg", "lag", 0, 2)
        await client_api.pull_message(broker.address, pull_header(topic="lag", group="lg", queue_offset=2,
                                                                  max_msg_nums=1), 3_000)
        clock.advance(4_000)
        text = (await broker.metrics.render()).decode()
    samples = _samples(text)
    queue = (("cluster", "DefaultCluster"), ("consumer_group", "lg"), ("is_retry", "false"),
             ("node_id", "broker-a"), ("queue_id", "0"), ("topic", "lag"))
    assert samples[("rocketmq_consumer_lag_messages", queue)] == 3
    assert samples[("rocketmq_consumer_inflight_messages", queue)] == 1
    assert samples[("rocketmq_consumer_ready_messages", queue)] == 2
    # the oldest unconsumed message (offset 2) was stored at t0 + 2 s; now is t0 + 9 s
    assert samples[("rocketmq_consumer_lag_latency", queue)] == 7.0
    node = (("cluster", "DefaultCluster"), ("node_id", "broker-a"))
    assert samples[("rocketmq_topic_number", node)] == 1
    assert samples[("rocketmq_consumer_group_number", node)] == 1
    assert samples[("rocketq_commit_log_bytes", node)] > 0
    assert samples[("rocketmq_storage_size", node)] > 0
    assert 0 < samples[("rocketq_disk_used_ratio", node)] <= 1
    assert samples[("rocketq_fsync_latency_seconds_count", node)] >= 1
    assert samples[("rocketq_connections", node)] == 1


async def test_metrics_endpoint_is_on_by_default_at_5557_and_0_turns_it_off(tmp_path: Path) -> None:
    assert BrokerConfig().metrics_port == 5557
    async with Broker(broker_config(tmp_path)) as broker:
        assert broker.metrics_port is None


async def test_metrics_port_in_use_fails_start_with_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            async with Broker(broker_config(tmp_path, metrics_port=port)):
                pass
