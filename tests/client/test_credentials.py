"""Clients with `credentials=` against a real broker with authentication and authorization on, over
TCP: a producer, a push consumer (slow listener, graceful stop) and a pull consumer do their work as
a Normal user allowed just that; a wrong secret, no credentials or a missing ACL is `NoPermission`
at once, never a hang or a retry loop; clients with other credentials never share a connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client import Credentials, Message, NoPermission, Producer, PullConsumer, PushConsumer
from conf.client import ClientConfig
from tests.client.test_slow_listener import SlowListener, committed
from tests.helpers import wait_until
from tests.security_helpers import add_user, admin_api, secured_config

TOPIC, GROUP, PULL_GROUP, PRODUCER_GROUP = "orders", "billing", "billing-pull", "billing-producers"
QUEUES, MESSAGES = 4, 96
APP_ACL = [(f"Topic:{TOPIC}", ["Pub", "Sub"]), (f"Group:{GROUP}", ["Sub"]), (f"Group:{PULL_GROUP}", ["Sub"])]
FAST = ClientConfig(persist_consumer_offset_interval_ms=200, rebalance_interval_ms=200)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(secured_config(tmp_path, lenient=True)) as running:
        async with admin_api() as api:
            await api.create_topic(running.address, TOPIC, queue_nums=QUEUES)
        yield running


def push_consumer(address: str, credentials: Credentials, listener: object, **options: object) -> PushConsumer:
    consumer = PushConsumer(GROUP, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET", client_config=FAST,
                            credentials=credentials, **options)  # type: ignore[arg-type]
    consumer.subscribe(TOPIC)
    consumer.register_listener(listener)  # type: ignore[arg-type]
    return consumer


async def test_producer_push_and_pull_consumers_work_as_a_normal_user(broker: Broker) -> None:
    app = await add_user(broker.address, "billing", APP_ACL)
    async with Producer(PRODUCER_GROUP, broker.address, credentials=app) as producer:
        for start in range(0, MESSAGES, 16):
            await producer.send_batch([Message(TOPIC, f"{i}".encode()) for i in range(start, start + 16)])
        assert (await producer.send(Message(TOPIC, b"one more"))).queue_id in range(QUEUES)
    total = MESSAGES + 1

    # a slow listener, stopped gracefully halfway: the committed offsets are what finished
    listener = SlowListener(0.02)
    first = push_consumer(broker.address, app, listener.sync, consume_thread_min=1, consume_thread_max=1,
                          pull_batch_size=8, pull_threshold_for_queue=4, await_termination_ms=10_000)
    await first.start()
    try:
        await wait_until(lambda: listener.count() >= total // 2, 20, "half the messages consumed")
    finally:
        stop_at = asyncio.get_running_loop().time()
        await first.shutdown()
    assert 0 < listener.count() < total, "the stop must come with a backlog left"
    assert not [t for t in listener.started if t > stop_at + 1], "no listener call long after the stop"
    async with admin_api() as api:
        offsets = await committed(api, broker.address, GROUP, TOPIC)
    assert sum(offsets) == listener.count() and offsets == [listener.prefix(q) for q in range(QUEUES)]

    rest = SlowListener(0)
    async with push_consumer(broker.address, app, rest.sync):
        await wait_until(lambda: listener.count() + rest.count() == total, 20, "the rest consumed")
    assert not set(listener.finished) & set(rest.finished), "nothing consumed twice"

    pulled: list[bytes] = []
    pull = PullConsumer(PULL_GROUP, broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                        client_config=FAST, credentials=app)
    pull.subscribe(TOPIC)
    async with pull, asyncio.timeout(20):
        while len(pulled) < total:
            pulled.extend(m.body for m in await pull.poll(1_000))
    assert sorted(pulled) == sorted([f"{i}".encode() for i in range(MESSAGES)] + [b"one more"])


async def test_a_wrong_secret_or_none_is_no_permission_at_once(broker: Broker) -> None:
    await add_user(broker.address, "billing", APP_ACL, password="right")
    for credentials, who in ((Credentials("billing", "wrong"), "billing"), (Credentials("nobody", "x"), "nobody"),
                             (None, "an unsigned request")):
        async with asyncio.timeout(10):      # a refusal, not a hang or a retry loop
            async with Producer(PRODUCER_GROUP, broker.address, credentials=credentials) as producer:
                with pytest.raises(NoPermission, match=f"authentication failed for {who}"):
                    await producer.send(Message(TOPIC, b"x"))
            push = push_consumer(broker.address, credentials, SlowListener(0).sync)  # type: ignore[arg-type]
            with pytest.raises(NoPermission, match=f"authentication failed for {who}"):
                await push.start()
            assert push.client_id is None, "a refused consumer is shut down"
            pull = PullConsumer(PULL_GROUP, broker.address, credentials=credentials)
            pull.subscribe(TOPIC)
            with pytest.raises(NoPermission, match=f"authentication failed for {who}"):
                await pull.start()
    async with admin_api() as api:
        assert sum(await committed(api, broker.address, GROUP, TOPIC)) == 0
        assert await api.get_max_offset(broker.address, TOPIC, 0) == 0, "nothing was stored"


async def test_a_missing_acl_names_the_resource_and_the_action(broker: Broker) -> None:
    publisher = await add_user(broker.address, "publisher", [(f"Topic:{TOPIC}", ["Pub"])])
    async with Producer(PRODUCER_GROUP, broker.address, credentials=publisher) as producer:
        await producer.send(Message(TOPIC, b"allowed"))
        with pytest.raises(NoPermission, match=r"User:publisher has no permission to [\w ]+ on Topic:payments"):
            await producer.send(Message("payments", b"refused"))
    consumer = push_consumer(broker.address, publisher, SlowListener(0).sync)
    with pytest.raises(NoPermission, match="User:publisher has no permission"):
        async with asyncio.timeout(10):
            await consumer.start()


async def test_clients_with_other_credentials_never_share_an_instance(broker: Broker) -> None:
    """One `instance_name`, so one client id, for three producers: the instance (and its connections)
    is shared by the two with the same credentials only; the wrong secret is refused while the
    right one goes on."""
    app = await add_user(broker.address, "billing", APP_ACL)
    shared = ClientConfig(instance_name="shared")
    right = [Producer(f"pg{i}", broker.address, client_config=shared,
                      credentials=Credentials("billing", app.secret_key)) for i in range(2)]
    wrong = Producer("pg-wrong", broker.address, client_config=shared, credentials=Credentials("billing", "wrong"))
    async with right[0], right[1], wrong:
        assert right[0]._instance is right[1]._instance and right[0]._instance is not wrong._instance
        with pytest.raises(NoPermission, match="authentication failed for billing"):
            await wrong.send(Message(TOPIC, b"refused"))
        for producer in right:
            await producer.send(Message(TOPIC, b"accepted"))
