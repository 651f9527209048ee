"""A name server with brokers registering and clients routing through it (REFERENCE.md §15)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tomllib
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from broker.broker import Broker
from broker.cli import resolve_config
from broker.process import BrokerSubprocess
from client import (
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from client.api import ClientAPI
from conf import ConfigError, dump_toml, load
from conf.client import ClientConfig
from conf.namesrv import ENV_PREFIX, NamesrvConfig
from namesrv.cli import resolve_namesrv_config
from namesrv.namesrv import NameServer
from protocol.bodies import HeartbeatData
from protocol.errors import RequestCodeNotSupported, TopicNotExist
from tests.conftest import broker_config
from tests.helpers import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "conf" / "namesrv.toml"


@asynccontextmanager
async def cluster(tmp_path: Path, names: list[str]) -> AsyncIterator[tuple[NameServer, list[Broker]]]:
    """A name server and in-process brokers `names` registering with it."""
    async with AsyncExitStack() as stack:
        ns = await stack.enter_async_context(NameServer(NamesrvConfig(listen_port=0)))
        brokers = [await stack.enter_async_context(Broker(broker_config(
            tmp_path / name, broker_name=name, namesrv_addr=ns.address, register_name_server_period_ms=500)))
            for name in names]
        yield ns, brokers


async def route_brokers(api: ClientAPI, address: str, topic: str) -> list[str]:
    try:
        route = await api.get_route_info(address, topic)
    except TopicNotExist:
        return []
    return [q.broker_name for q in route.queue_datas]


async def wait_route(api: ClientAPI, address: str, topic: str, expected: list[str], timeout_s: float = 5) -> None:
    async with asyncio.timeout(timeout_s):
        while await route_brokers(api, address, topic) != expected:
            await asyncio.sleep(0.02)


async def test_a_topic_over_two_brokers_is_produced_and_consumed_through_the_name_server(
        tmp_path: Path, client_api: ClientAPI) -> None:
    async with cluster(tmp_path, ["broker-a", "broker-b"]) as (ns, brokers):
        for broker in brokers:
            await client_api.create_topic(broker.address, "orders", queue_nums=2)
        await wait_route(client_api, ns.address, "orders", ["broker-a", "broker-b"], 2)   # at once, not in 30 s
        info = await client_api.get_broker_cluster_info(ns.address)
        assert info.cluster_addr_table == {"DefaultCluster": ["broker-a", "broker-b"]}
        assert "orders" in await client_api.get_all_topic_list(ns.address)

        received: Counter[str] = Counter()

        async def listener(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
            received.update(m.uniq_key or "" for m in msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumers = [PushConsumer("g", ns.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                  client_config=ClientConfig(instance_name=f"c{i}")) for i in range(2)]
        for consumer in consumers:
            consumer.subscribe("orders")
            consumer.register_listener(listener)
        async with consumers[0], consumers[1], Producer("pg", ns.address) as producer:
            results = [await producer.send(Message("orders", str(i).encode())) for i in range(40)]
            assert Counter(r.broker_name for r in results) == {"broker-a": 20, "broker-b": 20}
            sent = {r.uniq_keys[0] for r in results}
            await wait_until(lambda: sent <= set(received), 10, "every message consumed")
            owned = [mq for c in consumers for mq in c.assigned_queues("orders")]
            assert sorted(owned) == sorted({mq for mq in owned}) and len(owned) == 4
            assert {mq.broker_name for mq in consumers[0].assigned_queues("orders")} == {"broker-a"}
        with pytest.raises(RequestCodeNotSupported):        # a name server is no broker
            await client_api.send_heartbeat(ns.address, HeartbeatData(client_id="probe"))


async def test_a_clean_stop_unregisters_and_a_new_topic_registers_at_once(tmp_path: Path,
                                                                         client_api: ClientAPI) -> None:
    async with cluster(tmp_path, ["broker-a", "broker-b"]) as (ns, brokers):
        await client_api.create_topic(brokers[0].address, "t")
        await client_api.create_topic(brokers[1].address, "t")
        await wait_route(client_api, ns.address, "t", ["broker-a", "broker-b"], 2)
        await brokers[1].stop()
        assert await route_brokers(client_api, ns.address, "t") == ["broker-a"]


async def test_a_broker_that_stops_registering_leaves_the_routes(tmp_path: Path, client_api: ClientAPI) -> None:
    async with NameServer(NamesrvConfig(listen_port=0, broker_channel_expired_time_ms=1_500,
                                        scan_not_active_broker_interval_ms=100)) as ns:
        proc = BrokerSubprocess(tmp_path / "store", settings={"namesrv_addr": ns.address, "broker_name": "frozen",
                                                             "register_name_server_period_ms": "300"})
        async with proc:
            await client_api.create_topic(proc.address, "t")
            await wait_route(client_api, ns.address, "t", ["frozen"], 5)
            os.kill(proc.pid, signal.SIGSTOP)                  # alive, but silent
            try:
                await wait_route(client_api, ns.address, "t", [], 5)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            await wait_route(client_api, ns.address, "t", ["frozen"], 5)    # registers again


async def test_machine_room_nearby_gives_each_room_its_own_brokers_queues(tmp_path: Path,
                                                                         client_api: ClientAPI) -> None:
    async with cluster(tmp_path, ["r1_a", "r2_b", "r2_c"]) as (ns, brokers):
        for broker in brokers:
            await client_api.create_topic(broker.address, "rooms", queue_nums=2)
        await wait_route(client_api, ns.address, "rooms", ["r1_a", "r2_b", "r2_c"])

        def strategy() -> AllocateMachineRoomNearby:
            return AllocateMachineRoomNearby(AllocateMessageQueueAveragely(),
                                             broker_room_of=lambda mq: mq.broker_name.split("_")[0],
                                             consumer_room_of=lambda cid: cid.split("@")[1].split("-")[0])
        consumers = [PushConsumer("rooms-g", ns.address, allocate_strategy=strategy(),
                                  client_config=ClientConfig(instance_name=f"{room}-consumer"))
                     for room in ("r1", "r2")]
        for consumer in consumers:
            consumer.subscribe("rooms")
            consumer.register_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
        async with consumers[0], consumers[1]:
            await wait_until(lambda: len(consumers[0].assigned_queues("rooms")) == 2
                             and len(consumers[1].assigned_queues("rooms")) == 4, 10, "rooms split")
            assert {mq.broker_name for mq in consumers[0].assigned_queues("rooms")} == {"r1_a"}
            assert {mq.broker_name for mq in consumers[1].assigned_queues("rooms")} == {"r2_b", "r2_c"}


async def test_a_new_topic_is_spread_over_the_clusters_brokers(tmp_path: Path) -> None:
    async with cluster(tmp_path, ["broker-a", "broker-b"]) as (ns, _), Producer("pg", ns.address) as producer:
        first = await producer.send(Message("fresh", b"x"))        # no broker has "fresh" yet
        assert first.broker_name in ("broker-a", "broker-b")


def test_the_example_config_is_every_key_at_its_default() -> None:
    assert load(NamesrvConfig, file=EXAMPLE, env={}, env_prefix=ENV_PREFIX) == NamesrvConfig()
    assert set(tomllib.loads(EXAMPLE.read_text())) == set(tomllib.loads(dump_toml(NamesrvConfig())))


def test_name_server_and_broker_environments_do_not_mix() -> None:
    env = {"ROCKETQ_NAMESRV__LISTEN_PORT": "9877", "ROCKETQ_NAMESRV_ADDR": "127.0.0.1:9877",
           "ROCKETQ_LISTEN_PORT": "10912"}
    assert resolve_namesrv_config(EXAMPLE, None, None, [], env).listen_port == 9877
    broker = resolve_config(None, None, None, None, [], env)
    assert (broker.listen_port, broker.namesrv_addr) == (10912, "127.0.0.1:9877")
    with pytest.raises(ConfigError, match="namesrv_addr"):
        resolve_config(None, None, None, None, [], {}, namesrv_addr="no-port")


async def test_admin_topic_create_with_a_cluster_creates_it_on_every_broker(tmp_path: Path,
                                                                            client_api: ClientAPI) -> None:
    async with cluster(tmp_path, ["broker-a", "broker-b"]) as (ns, _):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rocketq", "admin", "topic", "create", "--topic", "spread", "--queues", "3",
            "--cluster", "DefaultCluster", "--endpoints", ns.address, "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0, stderr.decode()
        assert [row["broker_name"] for row in json.loads(stdout)] == ["broker-a", "broker-b"]
        await wait_route(client_api, ns.address, "spread", ["broker-a", "broker-b"], 2)
        unknown = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rocketq", "admin", "topic", "create", "--topic", "x", "--cluster", "nope",
            "--endpoints", ns.address, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, stderr = await asyncio.wait_for(unknown.communicate(), 30)
        assert unknown.returncode == 1 and b"no broker of cluster 'nope'" in stderr
