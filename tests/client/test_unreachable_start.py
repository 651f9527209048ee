"""Clients started before their broker: a `PushConsumer` starts anyway and consumes once the broker
is up (RocketMQ's start does not fail on an unreachable broker); a `Producer`'s send fails at once
with the connection error, and works once the broker is up. A broker that is reachable still
refuses an SQL92 subscription that does not compile, at `start()`."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from broker.broker import Broker
from client import (
    ConnectionClosed,
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
    MessageSelector,
    Producer,
    PushConsumer,
    SubscriptionParseFailed,
)
from client.instance import ClientInstance
from conf.client import ClientConfig
from tests.conftest import broker_config
from tests.helpers import free_port, wait_until

QUICK = ClientConfig(heartbeat_interval_ms=300, rebalance_interval_ms=300, poll_route_interval_ms=300,
                     persist_offset_interval_ms=300, request_timeout_ms=1_000, connect_timeout_ms=1_000)




def collecting_consumer(group: str, address: str, topic: str, received: list[bytes],
                        expression: str | MessageSelector = "*") -> PushConsumer:
    consumer = PushConsumer(group, address, client_config=QUICK, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(topic, expression)

    async def on_messages(msgs: list[MessageExt], context: object) -> ConsumeConcurrentlyStatus:
        received.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    consumer.register_listener(on_messages)
    return consumer


@pytest.mark.parametrize("expression", ["*", MessageSelector.by_sql("region = 'eu'")], ids=["tag", "sql92"])
async def test_push_consumer_started_before_its_broker_consumes_once_the_broker_is_up(
        tmp_path: Path, expression: str | MessageSelector) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    received: list[bytes] = []
    consumer = collecting_consumer("early-group", address, "early", received, expression)
    async with asyncio.timeout(5):
        await consumer.start()                  # nothing listens: warns, does not raise
    try:
        assert consumer.assigned_queues() == []
        async with Broker(broker_config(tmp_path, listen_port=port)) as broker:
            assert broker.address == address
            async with Producer("early-producers", address, client_config=QUICK) as producer:
                await producer.send(Message("early", b"not for eu", properties={"region": "us"}))
                await producer.send(Message("early", b"hello", properties={"region": "eu"}))
            expected = [b"hello"] if isinstance(expression, MessageSelector) else [b"not for eu", b"hello"]
            await wait_until(lambda: sorted(received) == sorted(expected), 5.0, "consumed once the broker is up")
    finally:
        async with asyncio.timeout(5):
            await consumer.shutdown()


async def test_producer_without_a_broker_fails_at_once_then_sends_once_it_is_up(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    async with Producer("lonely-producers", address, client_config=QUICK) as producer:
        async with asyncio.timeout(3):
            with pytest.raises(ConnectionClosed, match=f"{address}: cannot connect"):
                await producer.send(Message("lonely", b"x"))
        async with Broker(broker_config(tmp_path, listen_port=port)):
            async with asyncio.timeout(5):
                result = await producer.send(Message("lonely", b"x"))
            assert result.queue_offset == 0


async def test_an_unreachable_broker_is_registered_with_as_soon_as_it_answers(tmp_path: Path) -> None:
    """The heartbeat that could not reach the broker is sent again with the first route answer,
    before anything asks the broker for the group's members."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    slow = ClientConfig(heartbeat_interval_ms=60_000, rebalance_interval_ms=60_000, poll_route_interval_ms=60_000)
    consumer = PushConsumer("heal-group", address, client_config=slow)
    consumer.subscribe("heal")
    consumer.register_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    await consumer.start()
    try:
        instance = consumer._instance
        assert isinstance(instance, ClientInstance) and instance.heartbeats.unreached == {address}
        async with Broker(broker_config(tmp_path, listen_port=port)) as broker:
            await instance.update_route("heal")
            assert instance.heartbeats.unreached == set()
            group = broker.consumers.get("heal-group")
            assert group is not None and group.client_ids() == [consumer.client_id]
    finally:
        await consumer.shutdown()


async def test_a_reachable_broker_still_refuses_a_bad_sql92_expression_at_start(broker: Broker) -> None:
    consumer = collecting_consumer("bad-sql", broker.address, "t", [], MessageSelector.by_sql("a >"))
    with pytest.raises(SubscriptionParseFailed):
        await consumer.start()
    assert consumer.client_id is None, "shut down again"


async def test_producer_whose_broker_never_accepts_fails_within_the_connect_timeout() -> None:
    """A listener whose accept queue is full drops the connection attempts (as a host that is
    down but still routed does): the send fails after `connect_timeout_ms`, saying so, no hang."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        address = f"127.0.0.1:{full.getsockname()[1]}"
        fillers = [socket.socket() for _ in range(4)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(full.getsockname())
            config = ClientConfig(connect_timeout_ms=300, request_timeout_ms=300)
            async with Producer("stuck-producers", address, client_config=config) as producer:
                async with asyncio.timeout(3):
                    with pytest.raises(ConnectionClosed, match="not established within 300 ms"):
                        await producer.send(Message("stuck", b"x"))
        finally:
            for filler in fillers:
                filler.close()
