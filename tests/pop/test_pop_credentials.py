"""`SimpleConsumer(credentials=...)` against a broker with authentication and authorization on: a
Normal user with Sub on the topic and group receives, acks and changes invisible times; a user
without the group's ACL is refused NoPermission at once, never a hang."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client import Message, MessageView, NoPermission, Producer, SimpleConsumer
from tests.security_helpers import add_user, admin_api, secured_config

TOPIC, GROUP = "orders", "billing-pop"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(secured_config(tmp_path, lenient=True)) as running:
        async with admin_api() as api:
            await api.create_topic(running.address, TOPIC, queue_nums=2)
        yield running


async def test_simple_consumer_signs_its_pops_acks_and_changes(broker: Broker) -> None:
    app = await add_user(broker.address, "billing", [(f"Topic:{TOPIC}", ["Pub", "Sub"]), (f"Group:{GROUP}", ["Sub"])])
    async with Producer("billing-producers", broker.address, credentials=app) as producer:
        for i in range(4):
            await producer.send(Message(TOPIC, f"{i}".encode()))
    async with SimpleConsumer(GROUP, broker.address, subscriptions={TOPIC: "*"}, await_duration_s=0.5,
                              credentials=app) as consumer:
        received: list[MessageView] = []
        while len(received) < 4:
            received += await consumer.receive(4, invisible_duration_s=30)
        await consumer.change_invisible_duration(received[0], 60)
        for message in received:
            await consumer.ack(message)
    stranger = await add_user(broker.address, "stranger", [(f"Topic:{TOPIC}", ["Sub"])])
    async with SimpleConsumer(GROUP, broker.address, subscriptions={TOPIC: "*"}, await_duration_s=0.5,
                              credentials=stranger) as consumer:
        with pytest.raises(NoPermission):
            await consumer.receive(1, invisible_duration_s=30)
