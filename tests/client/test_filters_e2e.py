"""Filters end to end (issue 8): a real broker, real producers and consumers over TCP. Two groups on
one topic, one by tag and one by SQL92, each receive exactly their messages; tag edge cases
(untagged messages, "Aa"/"BB" hash collisions); a bad SQL92 expression fails `start()`."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable

import pytest

from broker.broker import Broker
from client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
    MessageSelector,
    Producer,
    PullConsumer,
    PushConsumer,
)
from client.api import ClientAPI
from conf.client import ClientConfig
from protocol.errors import SubscriptionParseFailed
from tests.helpers import wait_until

FAST = ClientConfig(persist_offset_interval_ms=200)
SQL = "TAGS IN ('paid', 'refund') AND amount > 100 AND region <> 'us'"
TAG = "paid || Aa"


class Collector:
    def __init__(self) -> None:
        self.bodies: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        with self.lock:
            self.bodies.update(m.body.decode() for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


def catalogue() -> list[tuple[Message, bool, bool, bool]]:
    """(message, matches TAG, matches SQL, is untagged) for a mix of tags and properties."""
    rows: list[tuple[Message, bool, bool, bool]] = []
    tags_cycle = ["paid", "refund", "Aa", "BB", None, "other"]
    for i in range(120):
        tag = tags_cycle[i % len(tags_cycle)]
        amount, region = (i * 7) % 250, ("eu", "us", "asia")[i % 3]
        props = {"amount": str(amount), "region": region} if i % 5 else {"region": region}
        message = Message("flt", f"m{i}".encode(), tags=tag, properties=props)
        matches_tag = tag in ("paid", "Aa")        # "BB" has "Aa"'s tags code: the client drops it
        matches_sql = tag in ("paid", "refund") and "amount" in props and amount > 100 and region != "us"
        rows.append((message, matches_tag, matches_sql, tag is None))
    return rows


def expected(rows: list[tuple[Message, bool, bool, bool]], pick: Callable[[tuple[Message, bool, bool, bool]], bool],
             ) -> Counter[str]:
    return Counter(row[0].body.decode() for row in rows if pick(row))


def push(address: str, group: str, selector: str | MessageSelector, listener: Collector) -> PushConsumer:
    consumer = PushConsumer(group, address, client_config=FAST, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe("flt", selector)
    consumer.register_listener(listener)
    return consumer


async def settle(consumers: list[PushConsumer], collectors: list[Collector], wanted: list[Counter[str]]) -> None:
    """Wait (bounded) until each collector holds exactly its wanted messages and nothing is cached."""
    for collector, want in zip(collectors, wanted, strict=True):
        await wait_until(lambda c=collector, w=want: c.bodies == w, 10.0,  # type: ignore[misc]
                         f"received {sum(collector.bodies.values())} of {sum(want.values())}")

    def drained() -> bool:
        return all(pq.msg_count == 0 for c in consumers for q in c.assigned_queues()
                   if (pq := c.process_queue(q)) is not None)
    await wait_until(drained, 5.0, "process queues drained")
    for collector, want in zip(collectors, wanted, strict=True):
        assert collector.bodies == want


async def test_two_groups_one_by_tag_one_by_sql_each_get_exactly_theirs(
        broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "flt", queue_nums=2)
    rows = catalogue()
    tagged, by_sql, everything = Collector(), Collector(), Collector()
    consumers = [push(broker.address, "g_tag", TAG, tagged),
                 push(broker.address, "g_sql", MessageSelector.by_sql(SQL), by_sql),
                 push(broker.address, "g_all", MessageSelector.by_tag("*"), everything)]
    for consumer in consumers:
        await consumer.start()
    try:
        async with Producer("pg", broker.address) as producer:
            for message, *_ in rows:
                await producer.send(message)
        wanted = [expected(rows, lambda r: r[1]), expected(rows, lambda r: r[2]), expected(rows, lambda r: True)]
        assert all(wanted) and wanted[0] != wanted[1]
        await settle(consumers, [tagged, by_sql, everything], wanted)
        untagged = expected(rows, lambda r: r[3])
        assert not (untagged & tagged.bodies) and untagged <= everything.bodies
    finally:
        for consumer in consumers:
            await consumer.shutdown()


async def test_pull_consumer_subscribes_by_sql(broker: Broker) -> None:
    rows = catalogue()
    async with Producer("pg", broker.address) as producer:
        for message, *_ in rows:
            await producer.send(message)
    consumer = PullConsumer("g_pull_sql", broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe("flt", MessageSelector.by_sql(SQL))
    await consumer.start()
    try:
        want = expected(rows, lambda r: r[2])
        got: Counter[str] = Counter()
        async with asyncio.timeout(10):
            while got != want:
                got.update(m.body.decode() for m in await consumer.poll(timeout_ms=200))
                assert got <= want
    finally:
        await consumer.shutdown()


async def test_bad_sql_fails_push_consumer_start_with_the_broker_position(broker: Broker) -> None:
    consumer = push(broker.address, "g_bad", MessageSelector.by_sql("amount > 100 AND region = "), Collector())
    with pytest.raises(SubscriptionParseFailed) as caught:
        await consumer.start()
    remark = caught.value.remark
    assert "line 1, column 27" in remark and "ends too early" in remark and remark.endswith("^")
    assert consumer.client_id is None, "the failed consumer is shut down"
    assert broker.consumers.get("g_bad") is None, "it never joined the group"
    # the same group can start with a good expression afterwards
    good = push(broker.address, "g_bad", MessageSelector.by_sql("amount > 100"), Collector())
    await good.start()
    await good.shutdown()


async def test_bad_sql_fails_pull_consumer_start(broker: Broker) -> None:
    consumer = PullConsumer("g_bad_pull", broker.address)
    consumer.subscribe("flt", MessageSelector.by_sql("a > 'x'"))
    with pytest.raises(SubscriptionParseFailed, match="column 5"):
        await consumer.start()


def test_selectors() -> None:
    assert MessageSelector.by_tag(None) == MessageSelector.by_tag() == MessageSelector("TAG", "*")
    assert MessageSelector.by_sql("a = 1") == MessageSelector("SQL92", "a = 1")
    with pytest.raises(ValueError, match="needs an expression"):
        MessageSelector.by_sql("  ")
