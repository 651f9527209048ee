"""With a name server, QueryRoute answers every broker's gRPC endpoint of a topic's queues (brokers
register their gRPC address); the official client then spreads its sends over both brokers."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from broker.broker import Broker
from conf.namesrv import NamesrvConfig
from namesrv.namesrv import NameServer
from tests.conftest import broker_config
from tests.grpc.conftest import blocking, endpoint
from tests.grpc.test_official_producer import message, receive_all
from tests.helpers import free_port, wait_until


def _send_everywhere(address: str, count: int) -> list[bytes]:
    config = ClientConfiguration(address, Credentials(), request_timeout=5)
    producer = Producer(config, ("spread",))
    consumer = SimpleConsumer(config, "G-spread", {"spread": FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        for i in range(count):
            producer.send(message("spread", f"m{i}".encode()))
        got = receive_all(consumer, count, timeout_s=15)
        for m in got:
            consumer.ack(m)
        return sorted(m.body for m in got)
    finally:
        producer.shutdown()
        consumer.shutdown()


async def test_route_lists_both_brokers_grpc_endpoints(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        ns = await stack.enter_async_context(NameServer(NamesrvConfig(listen_port=0)))
        brokers: list[Broker] = [await stack.enter_async_context(Broker(broker_config(
            tmp_path / name, broker_name=name, namesrv_addr=ns.address, register_name_server_period_ms=500,
            grpc_port=free_port()))) for name in ("broker-a", "broker-b")]
        for broker in brokers:
            broker.topics.for_send("spread", 0)
        await wait_until(lambda: (route := ns.routes.topic_route("spread")) is not None
                         and len(route.broker_datas) == 2, what="both brokers registered the topic")
        route = ns.routes.topic_route("spread")
        assert route is not None
        assert sorted(d.grpc_addrs[0] for d in route.broker_datas) == sorted(endpoint(b) for b in brokers)
        bodies = await blocking(_send_everywhere, endpoint(brokers[0]), 16, timeout_s=40)
        assert bodies == sorted(f"m{i}".encode() for i in range(16))
        stores = [b.store for b in brokers]
        assert all(s is not None and sum(s.get_max_offset("spread", q) for q in range(4)) > 0 for s in stores)
