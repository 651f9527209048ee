"""A consumer subscribed to a topic before it exists starts consuming as soon as it is created (the
broker tells the group to rebalance), not at its next periodic rebalance or route poll (20/30 s),
directly and through a name server; meanwhile the client says once, at INFO, that it waits."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.broker import Broker
from client import ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from client.api import ClientAPI
from conf.client import ClientConfig
from conf.namesrv import NamesrvConfig
from namesrv.namesrv import NameServer
from tests.conftest import broker_config
from tests.helpers import wait_until

DEFAULTS = ClientConfig()      # rebalance every 20 s, route poll every 30 s: neither may be what delivers


def waiting_consumer(group: str, endpoint: str, topic: str, received: list[bytes],
                     config: ClientConfig = DEFAULTS) -> PushConsumer:
    """A consumer with the default start position (CONSUME_FROM_LAST_OFFSET: a young queue is still
    read from 0)."""
    consumer = PushConsumer(group, endpoint, client_config=config)
    consumer.subscribe(topic)

    async def on_messages(msgs: list[MessageExt], context: object) -> ConsumeConcurrentlyStatus:
        received.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    consumer.register_listener(on_messages)
    return consumer


@pytest.mark.parametrize("created_by", ["send", "admin"])
async def test_a_consumer_waiting_for_its_topic_gets_the_first_message_within_3_s(
        broker: Broker, client_api: ClientAPI, created_by: str) -> None:
    received: list[bytes] = []
    async with waiting_consumer("early-birds", broker.address, "not-yet", received) as consumer:
        assert consumer.assigned_queues("not-yet") == []
        if created_by == "admin":
            await client_api.create_topic(broker.address, "not-yet", queue_nums=2)
        async with Producer("pg", broker.address) as producer:
            await producer.send(Message("not-yet", b"first"))   # auto-created by this send (send)
        await wait_until(lambda: received == [b"first"], 3.0, "the first message within 3 s")


async def test_through_a_name_server_the_notice_follows_the_registration(tmp_path: Path) -> None:
    async with NameServer(NamesrvConfig(listen_port=0)) as ns, \
            Broker(broker_config(tmp_path, namesrv_addr=ns.address)) as broker:     # registers every 30 s
        received: list[bytes] = []
        async with waiting_consumer("early-birds", ns.address, "not-yet", received):
            group = broker.consumers.get("early-birds")
            assert group is not None and "not-yet" in group.subscriptions, "it heartbeats the cluster's broker"
            async with Producer("pg", ns.address) as producer:
                await producer.send(Message("not-yet", b"first"))
            await wait_until(lambda: received == [b"first"], 3.0, "the first message within 3 s")


async def test_the_wait_is_said_once_at_info_and_the_route_when_it_comes(
        broker: Broker, client_api: ClientAPI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="client")
    received: list[bytes] = []
    quick = ClientConfig(rebalance_interval_ms=20, poll_route_interval_ms=20)

    def rebalances_without_route() -> int:
        return sum(1 for r in caplog.records if r.name == "client.consumer.rebalance"
                   and r.getMessage() == "no route for topic quiet yet; group quiet-group waits")
    async with waiting_consumer("quiet-group", broker.address, "quiet", received, quick):
        await wait_until(lambda: rebalances_without_route() >= 5, 3.0, "several rebalances without a route")
        said = [r for r in caplog.records if r.levelno >= logging.INFO and "topic quiet " in r.getMessage()]
        assert [(r.levelname, r.getMessage()) for r in said] == [
            ("INFO", f"topic quiet has no route yet (no broker of {broker.address} has it); group quiet-group "
                     f"will consume it as soon as it is created")]
        await client_api.create_topic(broker.address, "quiet", queue_nums=1)
        await wait_until(lambda: any(r.getMessage() == "topic quiet has a route now: broker-a (1 read queues)"
                                     for r in caplog.records), 3.0, "the route found is said")


async def test_a_topic_created_on_a_second_broker_is_consumed_there_at_once(tmp_path: Path,
                                                                          client_api: ClientAPI) -> None:
    """The route already lists the first broker: the second's notice makes the consumer ask for the
    route again (else it would wait for its route poll, 30 s), as a group's %RETRY% topic does in a
    cluster when a second broker takes its first send-back."""
    async with NameServer(NamesrvConfig(listen_port=0)) as ns, \
            Broker(broker_config(tmp_path / "a", namesrv_addr=ns.address, broker_name="broker-a")) as a, \
            Broker(broker_config(tmp_path / "b", namesrv_addr=ns.address, broker_name="broker-b")) as b:
        for broker in (a, b):        # "both" is on both brokers: the consumer heartbeats each of them
            await client_api.create_topic(broker.address, "both", queue_nums=1)
        await client_api.create_topic(a.address, "spread", queue_nums=1)
        await wait_until(lambda: len(ns.routes.topic_queue_table.get("both", {})) == 2
                         and "spread" in ns.routes.topic_queue_table, 3.0, "the topics routed")
        received: list[bytes] = []
        consumer = waiting_consumer("spreaders", ns.address, "spread", received)
        consumer.subscribe("both")
        async with consumer:
            await wait_until(lambda: len(consumer.assigned_queues("spread")) == 1, 3.0, "broker-a's queue")
            await wait_until(lambda: b.consumers.get("spreaders") is not None, 3.0, "a heartbeat to broker-b")
            await client_api.create_topic(b.address, "spread", queue_nums=1)
            await wait_until(lambda: len(consumer.assigned_queues("spread")) == 2, 3.0, "broker-b's queue too")
            async with Producer("pg", b.address) as producer:
                await producer.send(Message("spread", b"on b"))
            await wait_until(lambda: received == [b"on b"], 3.0, "the message on broker-b")
