"""`SimpleConsumer` over POP against a real broker over TCP: sharing a queue with no duplicates,
invisible time and revive, change_invisible_duration, expired acks, DLQ, FIFO order, slow and
never-acking consumers, pop beside pull. Every wait is bounded."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client import MessageView, ReceiptHandleExpired, SimpleConsumer
from client.api import ClientAPI
from client.producer.producer import Producer
from protocol.headers import CreateSubscriptionGroupRequestHeader
from protocol.message import Message
from protocol.model import PullStatus
from protocol.topics import dlq_topic
from tests.conftest import broker_config
from tests.helpers import pull_header, wait_until

TOPIC = "orders"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(broker_config(tmp_path, pop_revive_interval_ms=20)) as running:
        yield running


@pytest.fixture
async def producer(broker: Broker) -> AsyncIterator[Producer]:
    async with Producer("pg", broker.address) as running:
        yield running


async def create_topic(client_api: ClientAPI, broker: Broker, topic: str = TOPIC, queues: int = 1) -> None:
    await client_api.create_topic(broker.address, topic, queues)


async def send_bodies(producer: Producer, count: int, topic: str = TOPIC) -> None:
    for i in range(count):
        await producer.send(Message(topic, f"m{i}".encode()))


def consumer(broker: Broker, group: str = "sg", await_duration_s: float = 1.0) -> SimpleConsumer:
    return SimpleConsumer(group, broker.address, subscriptions={TOPIC: "*"}, await_duration_s=await_duration_s)


async def test_four_consumers_share_one_queue_with_no_duplicates(broker: Broker, producer: Producer,
                                                                 client_api: ClientAPI) -> None:
    await create_topic(client_api, broker, queues=1)
    await send_bodies(producer, 400)
    received: dict[bytes, int] = defaultdict(int)
    per_consumer: list[int] = [0, 0, 0, 0]

    async def run(index: int, c: SimpleConsumer) -> None:
        while sum(received.values()) < 400:
            for message in await c.receive(8, invisible_duration_s=30):
                received[message.body] += 1
                per_consumer[index] += 1
                await c.ack(message)

    consumers = [consumer(broker, await_duration_s=0.2) for _ in range(4)]
    for c in consumers:
        await c.start()
    try:
        await asyncio.wait_for(asyncio.gather(*(run(i, c) for i, c in enumerate(consumers))), timeout=30)
    finally:
        for c in consumers:
            await c.shutdown()
    assert len(received) == 400 and set(received.values()) == {1}
    assert all(n > 0 for n in per_consumer), per_consumer


async def test_unacked_message_returns_after_its_invisible_time(broker: Broker, producer: Producer,
                                                                client_api: ClientAPI) -> None:
    await create_topic(client_api, broker)
    await send_bodies(producer, 1)
    async with consumer(broker) as c:
        popped_at = time.monotonic()
        first = await c.receive(1, invisible_duration_s=0.3)
        assert len(first) == 1 and first[0].delivery_attempt == 1 and first[0].reconsume_times == 0
        again: list[MessageView] = []
        async with asyncio.timeout(5):
            while not again:
                again = await c.receive(1, invisible_duration_s=10)
        assert time.monotonic() - popped_at >= 0.29
        assert again[0].body == first[0].body and again[0].delivery_attempt == 2 and again[0].reconsume_times == 1
        with pytest.raises(ReceiptHandleExpired, match="no longer current"):
            await c.ack(first[0])
        await c.ack(again[0])
        with pytest.raises(ReceiptHandleExpired):
            await c.ack(again[0])        # twice


async def test_change_invisible_duration_extends_it(broker: Broker, producer: Producer,
                                                    client_api: ClientAPI) -> None:
    await create_topic(client_api, broker)
    await send_bodies(producer, 1)
    async with consumer(broker, await_duration_s=0.2) as c:
        [message] = await c.receive(1, invisible_duration_s=0.5)
        old_handle = message.receipt_handle
        await c.change_invisible_duration(message, 3)
        assert message.receipt_handle != old_handle
        started = time.monotonic()
        while time.monotonic() - started < 1.2:       # well past the first 0.5 s: still invisible
            assert await c.receive(1, invisible_duration_s=5) == []
        await c.ack(message)
        with pytest.raises(ReceiptHandleExpired):
            await c.change_invisible_duration(message, 3)


async def test_change_with_a_replaced_handle_is_refused(broker: Broker, producer: Producer,
                                                        client_api: ClientAPI) -> None:
    await create_topic(client_api, broker)
    await send_bodies(producer, 1)
    async with consumer(broker, await_duration_s=0.2) as c:
        [message] = await c.receive(1, invisible_duration_s=5)
        stale = type(message)(message.ext, message.receipt_handle, message.broker_name, message.broker_address, 0)
        await c.change_invisible_duration(message, 5)
        with pytest.raises(ReceiptHandleExpired):
            await c.ack(stale)
        await c.ack(message)


async def test_retry_max_times_failures_go_to_the_dlq(broker: Broker, producer: Producer,
                                                       client_api: ClientAPI) -> None:
    await create_topic(client_api, broker)
    await client_api.create_subscription_group(broker.address, CreateSubscriptionGroupRequestHeader(
        group_name="sg", retry_max_times=16))
    await send_bodies(producer, 1)
    attempts: list[int] = []
    async with consumer(broker, await_duration_s=0.5) as c:
        async with asyncio.timeout(30):
            while len(attempts) < 17:
                attempts += [m.delivery_attempt for m in await c.receive(1, invisible_duration_s=0.05)]
        assert attempts == list(range(1, 18))
        store = broker.store
        assert store is not None
        await wait_until(lambda: store.get_max_offset(dlq_topic("sg"), 0) == 1, what="message in the DLQ")
        assert await c.receive(1, invisible_duration_s=1) == []    # never again
    result = await client_api.pull_message(broker.address, pull_header(topic=dlq_topic("sg"), group="dlq-reader"),
                                           timeout_ms=3_000)
    assert result.status is PullStatus.FOUND
    assert result.messages[0].body == b"m0" and result.messages[0].reconsume_times == 17


async def test_a_consumer_that_never_acks_is_bounded(tmp_path: Path) -> None:
    async with Broker(broker_config(tmp_path, pop_max_in_flight_per_queue=50)) as broker, \
            Producer("pg", broker.address) as producer, \
            SimpleConsumer("greedy", broker.address, subscriptions={TOPIC: "*"}, await_duration_s=0.1) as c:
        for i in range(200):
            await producer.send(Message(TOPIC, f"m{i}".encode()))
        got = 0
        for _ in range(20):
            got += len(await c.receive(32, invisible_duration_s=600))
        assert broker.pop_service is not None
        held = sum(s.held_count for s in broker.pop_service.queues.values())
        assert got == held <= 50 * 4                # 4 queues of the auto-created topic, 50 each


async def test_a_slow_consumer_and_a_fast_one_share_without_loss(broker: Broker, producer: Producer,
                                                                  client_api: ClientAPI) -> None:
    await create_topic(client_api, broker, queues=2)
    await send_bodies(producer, 100)
    seen: dict[bytes, int] = defaultdict(int)

    async def run(c: SimpleConsumer, delay_s: float) -> None:
        while len(seen) < 100:
            for message in await c.receive(4, invisible_duration_s=5):
                await asyncio.sleep(delay_s)     # the work itself (not a synchronisation)
                seen[message.body] += 1
                await c.ack(message)

    async with consumer(broker, await_duration_s=0.2) as slow, consumer(broker, await_duration_s=0.2) as fast:
        await asyncio.wait_for(asyncio.gather(run(slow, 0.05), run(fast, 0)), timeout=30)
    assert len(seen) == 100 and set(seen.values()) == {1}


async def test_shutdown_while_a_receive_is_held(broker: Broker, client_api: ClientAPI) -> None:
    await create_topic(client_api, broker)
    c = consumer(broker, await_duration_s=30)
    await c.start()
    receive = asyncio.create_task(c.receive(1, invisible_duration_s=5))
    await wait_until(lambda: broker.hold_service is not None and broker.hold_service.held_count == 1,
                     what="held pop")
    started = time.monotonic()
    await broker.stop()
    assert await asyncio.wait_for(receive, timeout=5) == []
    assert time.monotonic() - started < 5
    await c.shutdown()


async def test_held_receive_wakes_on_arrival(broker: Broker, producer: Producer, client_api: ClientAPI) -> None:
    await create_topic(client_api, broker, queues=4)
    async with consumer(broker, await_duration_s=20) as c:
        receive = asyncio.create_task(c.receive(4, invisible_duration_s=5))
        await wait_until(lambda: broker.hold_service is not None and broker.hold_service.held_count == 4,
                         what="held pop on 4 queues")
        started = time.monotonic()
        await producer.send(Message(TOPIC, b"late"))
        [message] = await asyncio.wait_for(receive, timeout=5)
        assert message.body == b"late" and time.monotonic() - started < 2


async def test_pop_and_pull_of_one_group_keep_separate_offsets(broker: Broker, producer: Producer,
                                                               client_api: ClientAPI) -> None:
    await create_topic(client_api, broker)
    await send_bodies(producer, 3)
    async with consumer(broker, group="mixed") as c:
        popped = await c.receive(32, invisible_duration_s=30)
        for message in popped:
            await c.ack(message)
    pulled = await client_api.pull_message(broker.address, pull_header(topic=TOPIC, group="mixed"),
                                           timeout_ms=3_000)
    assert [m.body for m in popped] == [m.body for m in pulled.messages] == [b"m0", b"m1", b"m2"]
    # pops committed no pull offset (the broker answers a group without one with the queue's start)
    assert await client_api.query_consumer_offset(broker.address, "mixed", TOPIC, 0) == 0


async def test_consumer_shutdown_while_its_receive_is_held(broker: Broker, client_api: ClientAPI) -> None:
    await create_topic(client_api, broker)
    c = consumer(broker, await_duration_s=30)
    await c.start()
    receive = asyncio.create_task(c.receive(1, invisible_duration_s=5))
    await wait_until(lambda: broker.hold_service is not None and broker.hold_service.held_count == 1,
                     what="held pop")
    started = time.monotonic()
    await c.shutdown()
    assert await asyncio.wait_for(receive, timeout=5) == []
    assert time.monotonic() - started < 5
