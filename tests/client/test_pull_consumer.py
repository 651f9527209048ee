"""`PullConsumer` against a real broker over TCP: assign and subscribe modes, commits, seeks, the
iterator, poll timeouts, flow control and a broker restart. Every wait is bounded."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from client.consumer.lite_pull_service import LitePullService, StartFrom
from client.consumer.process_queue import ProcessQueue
from client.consumer.pull_consumer import PullConsumer
from client.consumer.pull_service import TopicSubscription
from client.errors import ClientStateError
from client.producer.producer import Producer
from protocol.message import Message, MessageExt
from protocol.model import ExpressionType, MessageQueue
from tests.conftest import broker_config
from tests.helpers import held_pulls, send, wait_until

TOPIC = "orders"


@pytest.fixture
async def producer(broker: Broker) -> AsyncIterator[Producer]:
    async with Producer("pg", broker.address) as running:
        yield running


async def send_bodies(producer: Producer, bodies: list[bytes], topic: str = TOPIC, tags: str | None = None) -> None:
    for body in bodies:
        await producer.send(Message(topic, body, tags=tags))


async def poll_until(consumer: PullConsumer, count: int, timeout_s: float = 10.0) -> list[MessageExt]:
    """Poll until at least `count` messages came (failing after `timeout_s`)."""
    got: list[MessageExt] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < count:
            got.extend(await consumer.poll(timeout_ms=500))
    return got


def by_queue(messages: list[MessageExt]) -> dict[int, list[MessageExt]]:
    queues: dict[int, list[MessageExt]] = defaultdict(list)
    for message in messages:
        queues[message.queue_id].append(message)
    return dict(queues)


async def assigned_consumer(group: str, broker: Broker, **options: object) -> PullConsumer:
    consumer = PullConsumer(group, broker.address, **options)  # type: ignore[arg-type]
    await consumer.start()
    consumer.assign(await consumer.fetch_message_queues(TOPIC))
    return consumer


async def test_assign_poll_gets_every_message_in_order_per_queue(broker: Broker, client_api: ClientAPI,
                                                                 producer: Producer) -> None:
    await client_api.create_topic(broker.address, TOPIC, 4)
    bodies = [f"m{i:03}".encode() for i in range(40)]
    await send_bodies(producer, bodies)
    consumer = await assigned_consumer("g-assign", broker)
    try:
        assert {mq.queue_id for mq in consumer.assignment()} == {0, 1, 2, 3}
        got = await poll_until(consumer, 40)
    finally:
        await consumer.shutdown()
    assert sorted(m.body for m in got) == bodies
    for messages in by_queue(got).values():
        assert [m.queue_offset for m in messages] == list(range(len(messages)))
        assert [m.body for m in messages] == sorted(m.body for m in messages)   # sent order


async def test_commit_sync_stores_positions_and_a_new_consumer_resumes_after_them(
        broker: Broker, client_api: ClientAPI, producer: Producer) -> None:
    await client_api.create_topic(broker.address, TOPIC, 4)
    await send_bodies(producer, [f"a{i}".encode() for i in range(20)])
    first = await assigned_consumer("g-resume", broker, auto_commit=False)
    try:
        first_got = await poll_until(first, 20)
        await first.commit_sync()
        queues = sorted(first.assignment())
        assert [await first.committed(mq) for mq in queues] == [5, 5, 5, 5]
    finally:
        await first.shutdown()
    assert len(first_got) == 20
    for queue_id in range(4):
        assert await client_api.query_consumer_offset(broker.address, "g-resume", TOPIC, queue_id) == 5

    later = [f"b{i}".encode() for i in range(8)]
    await send_bodies(producer, later)
    second = await assigned_consumer("g-resume", broker)      # auto_commit: commits at shutdown
    try:
        got = await poll_until(second, 8)
        assert await second.poll(timeout_ms=100) == []
    finally:
        await second.shutdown()
    assert sorted(m.body for m in got) == later
    assert {m.queue_offset for m in got} == {5, 6}
    for queue_id in range(4):
        assert await client_api.query_consumer_offset(broker.address, "g-resume", TOPIC, queue_id) == 7


async def test_subscribers_of_one_group_split_the_queues_and_get_every_message_once(
        broker: Broker, client_api: ClientAPI, producer: Producer) -> None:
    await client_api.create_topic(broker.address, TOPIC, 8)
    consumers = [PullConsumer("g-split", broker.address) for _ in range(2)]
    for consumer in consumers:
        consumer.subscribe(TOPIC)
        await consumer.start()
    try:
        def balanced() -> bool:
            a, b = (c.assignment() for c in consumers)
            return len(a) == 4 and len(b) == 4 and not a & b
        await wait_until(balanced, 10, "8 queues split 4/4 without overlap")
        all_queues = set(await consumers[0].fetch_message_queues(TOPIC))
        assert consumers[0].assignment() | consumers[1].assignment() == all_queues

        bodies = [f"s{i:03}".encode() for i in range(48)]
        await send_bodies(producer, bodies)
        received: list[list[MessageExt]] = [[], []]

        async def drain(index: int) -> None:
            while sum(map(len, received)) < len(bodies):
                received[index].extend(await consumers[index].poll(timeout_ms=200))

        async with asyncio.timeout(10):
            await asyncio.gather(drain(0), drain(1))
        shares = [c.assignment() for c in consumers]
    finally:
        for consumer in consumers:
            await consumer.shutdown()
    assert sorted(m.body for part in received for m in part) == bodies          # each exactly once
    for index, share in enumerate(shares):
        assert received[index], "both consumers got a share"
        assert {m.queue_id for m in received[index]} <= {mq.queue_id for mq in share}


async def test_subscription_tags_are_filtered(broker: Broker, client_api: ClientAPI, producer: Producer) -> None:
    await client_api.create_topic(broker.address, TOPIC, 2)
    await send_bodies(producer, [b"b1", b"b2"], tags="TagB")
    await send_bodies(producer, [b"a1", b"a2"], tags="TagA")
    consumer = PullConsumer("g-tags", broker.address)
    consumer.subscribe(TOPIC, "TagA || TagC")
    async with consumer:
        got = await poll_until(consumer, 2)
        assert await consumer.poll(timeout_ms=100) == []
    assert sorted(m.body for m in got) == [b"a1", b"a2"]


async def test_subscribe_and_unsubscribe_after_start(broker: Broker, client_api: ClientAPI,
                                                     producer: Producer) -> None:
    await client_api.create_topic(broker.address, TOPIC, 2)
    await client_api.create_topic(broker.address, "other", 1)
    await send_bodies(producer, [b"x1", b"x2"])
    async with PullConsumer("g-late", broker.address) as consumer:
        assert consumer.assignment() == set()
        consumer.subscribe(TOPIC)
        consumer.subscribe("other")
        await wait_until(lambda: len(consumer.assignment()) == 3, 5, "both topics' queues taken")
        assert sorted(m.body for m in await poll_until(consumer, 2)) == [b"x1", b"x2"]
        consumer.unsubscribe(TOPIC)
        await wait_until(lambda: {mq.topic for mq in consumer.assignment()} == {"other"}, 5, "orders dropped")
        with pytest.raises(ClientStateError):
            consumer.assign([])
    for queue_id in range(2):       # dropping a queue stores its consumed position
        assert await client_api.query_consumer_offset(broker.address, "g-late", TOPIC, queue_id) == 1


async def test_seek_seek_to_begin_and_seek_to_timestamp(broker: Broker, client_api: ClientAPI,
                                                        producer: Producer) -> None:
    await client_api.create_topic(broker.address, TOPIC, 1)
    await send_bodies(producer, [f"t{i}".encode() for i in range(10)])
    consumer = await assigned_consumer("g-seek", broker)
    try:
        (queue,) = consumer.assignment()
        first = await poll_until(consumer, 10)
        assert [m.queue_offset for m in first] == list(range(10))

        consumer.seek(queue, 3)
        assert [m.queue_offset for m in await poll_until(consumer, 7)] == list(range(3, 10))

        consumer.seek_to_begin(queue)
        assert [m.queue_offset for m in await poll_until(consumer, 10)] == list(range(10))

        stored_at_ms = first[6].store_timestamp
        expected = min(m.queue_offset for m in first if m.store_timestamp == stored_at_ms)  # exact match rule
        await consumer.seek_to_timestamp(queue, stored_at_ms)
        again = await poll_until(consumer, 10 - expected)
        assert [m.queue_offset for m in again] == list(range(expected, 10))
        assert await consumer.poll(timeout_ms=100) == []

        with pytest.raises(ClientStateError):
            consumer.seek(MessageQueue(TOPIC, queue.broker_name, 7), 0)
    finally:
        await consumer.shutdown()


async def test_seek_to_end_delivers_only_later_messages(broker: Broker, client_api: ClientAPI,
                                                        producer: Producer) -> None:
    await client_api.create_topic(broker.address, TOPIC, 1)
    await send_bodies(producer, [f"e{i}".encode() for i in range(5)])
    consumer = await assigned_consumer("g-end", broker, auto_commit=False)
    try:
        (queue,) = consumer.assignment()
        consumer.seek(queue, 2)
        await poll_until(consumer, 3)
        await held_pulls(broker, topic=TOPIC, count=1)       # the pull at offset 5
        consumer.seek_to_end(queue)
        await held_pulls(broker, topic=TOPIC, count=2)       # the new task's pull from the looked-up end
        await send_bodies(producer, [b"late"])
        got = await poll_until(consumer, 1)
        assert [(m.queue_offset, m.body) for m in got] == [(5, b"late")]
    finally:
        await consumer.shutdown()


async def test_async_for_yields_one_by_one_until_shutdown(broker: Broker, client_api: ClientAPI,
                                                          producer: Producer) -> None:
    await client_api.create_topic(broker.address, TOPIC, 2)
    bodies = [f"i{i}".encode() for i in range(6)]
    await send_bodies(producer, bodies)
    consumer = await assigned_consumer("g-iter", broker)
    got: list[MessageExt] = []

    async def iterate() -> None:
        async for message in consumer:
            got.append(message)

    task = asyncio.create_task(iterate())
    try:
        await wait_until(lambda: len(got) == 6, 10, "six messages iterated")
    finally:
        await consumer.shutdown()
    await asyncio.wait_for(task, 2)          # the iteration ends with the consumer
    assert sorted(m.body for m in got) == bodies
    for queue_id in range(2):                # auto-commit at shutdown: 3 messages per queue
        assert await client_api.query_consumer_offset(broker.address, "g-iter", TOPIC, queue_id) == 3


async def test_poll_timeout_returns_empty_after_about_the_timeout(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, TOPIC, 2)
    consumer = await assigned_consumer("g-timeout", broker)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        assert await consumer.poll(timeout_ms=300) == []
        elapsed = loop.time() - started
        assert 0.29 <= elapsed < 1.5
        started = loop.time()
        assert await consumer.poll(timeout_ms=0) == []
        assert loop.time() - started < 0.2
    finally:
        await consumer.shutdown()


async def test_state_errors_and_bad_settings(broker: Broker) -> None:
    queue = MessageQueue(TOPIC, "b", 0)
    consumer = PullConsumer("g-state", broker.address)
    with pytest.raises(ClientStateError):
        await consumer.poll(timeout_ms=0)
    consumer.subscribe(TOPIC)
    with pytest.raises(ClientStateError):
        consumer.assign([queue])
    other = PullConsumer("g-state", broker.address)
    other.assign([queue])
    with pytest.raises(ClientStateError):
        other.subscribe(TOPIC)
    assert other.assignment() == {queue}
    with pytest.raises(ValueError):
        PullConsumer("g", broker.address, auto_commit_interval_ms=999)
    with pytest.raises(ValueError):
        PullConsumer("g", broker.address, pull_batch_size=0)
    async with PullConsumer("g-state2", broker.address) as started:
        pass
    with pytest.raises(ClientStateError):
        await started.poll()
    with pytest.raises(ClientStateError):
        await started.start()


async def test_broadcasting_commits_to_the_local_file(broker: Broker, client_api: ClientAPI, producer: Producer,
                                                      tmp_path: Path) -> None:
    await client_api.create_topic(broker.address, TOPIC, 2)
    await send_bodies(producer, [f"c{i}".encode() for i in range(4)])
    consumer = PullConsumer("g-bcast", broker.address, message_model="BROADCASTING", auto_commit=False,
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            offset_store_dir=tmp_path / "offsets")
    consumer.subscribe(TOPIC)
    async with consumer:
        await wait_until(lambda: len(consumer.assignment()) == 2, 5, "broadcasting takes every queue")
        await poll_until(consumer, 4)
        await consumer.commit_sync()
        (path,) = (tmp_path / "offsets").rglob("offsets.json")
        table = json.loads(path.read_text())["offset_table"]
        assert sorted((e["queue_id"], e["offset"]) for e in table) == [(0, 2), (1, 2)]
        assert [await consumer.committed(mq) for mq in sorted(consumer.assignment())] == [2, 2]


async def test_pulling_survives_a_broker_restart(tmp_path: Path, client_api: ClientAPI) -> None:
    first = Broker(broker_config(tmp_path))
    await first.start()
    address = first.address
    port = int(address.rsplit(":", 1)[1])
    await client_api.create_topic(address, TOPIC, 1)
    await send(client_api, address, TOPIC, b"before")
    consumer = await assigned_consumer("g-restart", first)
    second: Broker | None = None
    try:
        assert [m.body for m in await poll_until(consumer, 1)] == [b"before"]
        await first.stop()
        second = Broker(broker_config(tmp_path, listen_port=port))
        await second.start()
        await send(client_api, address, TOPIC, b"after")
        got = await poll_until(consumer, 1, timeout_s=15)
        assert [(m.queue_offset, m.body) for m in got] == [(1, b"after")]
    finally:
        await consumer.shutdown()
        if second is not None:
            await second.stop()
        else:
            await first.stop()


async def test_a_queue_stops_pulling_at_its_threshold_until_poll_makes_room(broker: Broker,
                                                                            client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, TOPIC, 1)
    for i in range(200):
        await send(client_api, broker.address, TOPIC, f"{i}".encode())
    mq = MessageQueue(TOPIC, broker.config.broker_name, 0)

    async def start_offset_of(mq: MessageQueue, start: StartFrom) -> int:
        return 0

    service = LitePullService(
        api=client_api, address_of=lambda mq: broker.address, consumer_group="g", pull_batch_size=2,
        pull_threshold_for_queue=5,
        subscription_of=lambda topic: TopicSubscription(topic, "*", ExpressionType.TAG, frozenset(), 0),
        start_offset_of=start_offset_of, on_remove=lambda mq, offset: None)
    pq = ProcessQueue(now_ms=0)
    service.start(mq, pq, StartFrom.STORED)
    state = service._queues[mq]
    try:
        await wait_until(lambda: pq.msg_count >= 5 and not state.room.is_set(), 5, "the queue waits for room")
        assert pq.msg_count == 6                       # 3 pulls of 2: the third passed the threshold
        assert [m.queue_offset for m in await service.take(4, 0)] == [0, 1, 2, 3]
        assert service.consumed_offsets() == {mq: 4}
        await wait_until(lambda: pq.msg_count == 6 and not state.room.is_set(), 5, "two more pulls, then wait")
        assert [m.queue_offset for m in await service.take(100, 0)] == [4, 5, 6, 7, 8, 9]
        service.seek(mq, 100)
        assert service.consumed_offsets() == {mq: 100}
        await wait_until(lambda: pq.msg_count >= 5 and not state.room.is_set(), 5, "refilled after the seek")
        assert [m.queue_offset for m in await service.take(2, 0)] == [100, 101]
    finally:
        await service.stop_all()
