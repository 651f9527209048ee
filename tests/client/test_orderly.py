"""Orderly consumption against a real broker: per-key order with `SelectMessageQueueByHash`, the
broker lock table, SUSPEND and its retry, a queue held by another client, handover and unlock at
shutdown, sync and async listeners; plus the pure helpers."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import defaultdict

from broker.broker import Broker
from client import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
    SelectMessageQueueByHash,
)
from client.api import ClientAPI
from client.consumer.consume_orderly import dlq_bound_header, orderly_max_reconsume_times, suspend_time_ms
from conf.client import ClientConfig
from protocol.message import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC
from tests.helpers import pull_header, wait_until

FAST = ClientConfig(persist_offset_interval_ms=200, rebalance_interval_ms=500)
SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


async def produce_keyed(address: str, topic: str, keys: int, per_key: int, first_seq: int = 0) -> list[tuple[str, int]]:
    """`per_key` messages for each of `keys` keys, body "key:seq" (seq from `first_seq`), sent in
    seq order per key."""
    sent = []
    async with Producer("opg", address) as producer:
        selector = SelectMessageQueueByHash()
        for seq in range(first_seq, first_seq + per_key):
            for k in range(keys):
                key = f"k{k}"
                await producer.send(Message(topic, f"{key}:{seq}".encode(), keys=key), selector, key)
                sent.append((key, seq))
    return sent


def orderly(address: str, group: str, topic: str, listener: object, config: ClientConfig = FAST,
            **options: object) -> PushConsumer:
    c = PushConsumer(group, address, client_config=config, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     **options)  # type: ignore[arg-type]
    c.subscribe(topic)
    c.register_listener(listener, orderly=True)  # type: ignore[arg-type]
    return c


class KeyLog:
    """Records, per key, the sequence numbers in the order the listener saw them, and the queues
    each client consumed (thread-safe, for sync and async listeners alike)."""

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = defaultdict(list)
        self.queues_by_client: dict[str, set[int]] = defaultdict(set)
        self.count = 0
        self._lock = threading.Lock()

    def record(self, msgs: list[MessageExt], ctx: ConsumeOrderlyContext, client: str = "") -> None:
        with self._lock:
            for m in msgs:
                key, seq = m.body.decode().split(":")
                self.seen[key].append(int(seq))
            self.queues_by_client[client].add(ctx.message_queue.queue_id)
            self.count += len(msgs)

    def distinct(self) -> int:
        with self._lock:
            return sum(len(set(seqs)) for seqs in self.seen.values())

    def in_order(self) -> bool:
        return all(seqs == sorted(seqs) for seqs in self.seen.values())


async def test_each_key_is_consumed_in_send_order_by_an_async_listener(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "ord", queue_nums=4)
    log = KeyLog()

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        log.record(msgs, ctx)
        await asyncio.sleep(0)
        return SUCCESS

    c = orderly(broker.address, "og", "ord", listener, consume_message_batch_max_size=3)
    async with c:
        await wait_until(lambda: len(c.assigned_queues("ord")) == 4, 5, "all queues assigned")
        owners = broker.locks.owners("og")      # the topic's queues and the group's retry queue
        assert set(owners) == set(c.assigned_queues()) and set(owners.values()) == {c.client_id}
        sent = await produce_keyed(broker.address, "ord", keys=40, per_key=25)
        await wait_until(lambda: log.count >= len(sent), 10, "everything consumed")
    assert log.in_order() and all(seqs == list(range(25)) for seqs in log.seen.values())
    assert broker.locks.owners("og") == {}, "shutdown unlocks every queue"
    for queue_id in range(4):
        committed = await client_api.query_consumer_offset(broker.address, "og", "ord", queue_id)
        assert committed == await client_api.get_max_offset(broker.address, "ord", queue_id)


async def test_suspend_retries_the_same_messages_later_and_holds_back_the_rest(broker: Broker,
                                                                              client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "sus", queue_nums=1)
    seen: list[tuple[str, int]] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:   # sync
        (m,) = msgs
        seen.append((m.body.decode(), m.reconsume_times))
        if m.body == b"k0:2" and m.reconsume_times < 2:
            ctx.suspend_current_queue_time_ms = 50
            return SUSPEND
        if m.body == b"k0:4" and m.reconsume_times < 1:
            raise RuntimeError("listener bug: counted as SUSPEND")
        return SUCCESS

    c = orderly(broker.address, "sg", "sus", listener, suspend_current_queue_time_ms=20)
    async with c:
        await produce_keyed(broker.address, "sus", keys=1, per_key=6)
        await wait_until(lambda: len(seen) >= 9, 10, "all consumed")
    assert seen == [("k0:0", 0), ("k0:1", 0), ("k0:2", 0), ("k0:2", 1), ("k0:2", 2), ("k0:3", 0),
                    ("k0:4", 0), ("k0:4", 1), ("k0:5", 0)]
    assert await client_api.query_consumer_offset(broker.address, "sg", "sus", 0) == 6


async def test_a_sync_listener_failing_inside_a_run_of_batches_commits_the_batches_before_it(
        broker: Broker, client_api: ClientAPI) -> None:
    """A backlog, so one thread hop runs several batches (`SYNC_RUN_BATCHES`): a SUSPEND, an
    exception and a SUCCESS without auto_commit in the middle of runs end the run there; the
    batches before are committed, the failed one is retried, the rest are neither lost nor
    consumed out of order."""
    await client_api.create_topic(broker.address, "run", queue_nums=1)
    await produce_keyed(broker.address, "run", keys=1, per_key=20)
    seen: list[tuple[list[int], int, int]] = []      # (seqs, reconsume_times, committed offset then)
    loop = asyncio.get_running_loop()

    async def committed_offset() -> int:
        (queue,) = [q for q in c.running_info("").mq_table if q.topic == "run"]
        return queue.committed_offset

    def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:   # sync
        seqs = [int(m.body.decode().split(":")[1]) for m in msgs]
        seen.append((seqs, msgs[0].reconsume_times,
                     asyncio.run_coroutine_threadsafe(committed_offset(), loop).result(5)))
        if seqs[0] == 6 and msgs[0].reconsume_times == 0:
            ctx.suspend_current_queue_time_ms = 10
            return SUSPEND
        if seqs[0] == 12 and msgs[0].reconsume_times == 0:
            raise RuntimeError("listener bug: counted as SUSPEND")
        if seqs[0] == 16:
            ctx.auto_commit = False               # SUCCESS without auto_commit: not committed
        return SUCCESS

    c = orderly(broker.address, "rg", "run", listener, suspend_current_queue_time_ms=10,
                consume_message_batch_max_size=2)
    async with c:
        await wait_until(lambda: len(seen) >= 12, 10, "all consumed")
    assert [(seqs, times) for seqs, times, _ in seen] == [
        ([0, 1], 0), ([2, 3], 0), ([4, 5], 0), ([6, 7], 0), ([6, 7], 1), ([8, 9], 0), ([10, 11], 0),
        ([12, 13], 0), ([12, 13], 1), ([14, 15], 0), ([16, 17], 0), ([18, 19], 0)]
    committed = {(seqs[0], times): offset for seqs, times, offset in seen}
    assert committed[(0, 0)] in (-1, 0)                     # the first run: nothing committed yet
    assert committed[(6, 1)] == 6                           # the batches before the failed one
    assert committed[(12, 1)] == 12
    assert committed[(18, 0)] == 16                         # 16-17 answered without auto_commit
    assert await client_api.query_consumer_offset(broker.address, "rg", "run", 0) == 20


async def test_a_queue_locked_by_another_client_is_not_consumed_until_released(broker: Broker,
                                                                               client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "held", queue_nums=2)
    mq0 = MessageQueue("held", broker.config.broker_name, 0)
    assert await client_api.lock_batch_mq(broker.address, "hg", "intruder", [mq0]) == {mq0}
    log = KeyLog()

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        log.record(msgs, ctx)
        return SUCCESS

    c = orderly(broker.address, "hg", "held", listener)
    async with c:
        await wait_until(lambda: len(c.assigned_queues("held")) == 1, 5, "queue 1 taken")
        assert c.assigned_queues("held") == [MessageQueue("held", broker.config.broker_name, 1)]
        sent = await produce_keyed(broker.address, "held", keys=8, per_key=10)
        await wait_until(lambda: log.count > 0, 5)
        assert log.queues_by_client[""] == {1} and broker.locks.owners("hg")[mq0] == "intruder"
        await client_api.unlock_batch_mq(broker.address, "hg", "intruder", [mq0])
        await wait_until(lambda: log.count >= len(sent), 10, "queue 0 consumed once released")
    assert log.in_order() and log.queues_by_client[""] == {0, 1}


async def test_a_joining_consumer_gets_queues_only_after_they_are_unlocked(broker: Broker,
                                                                           client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "hand", queue_nums=4)
    log = KeyLog()
    names: dict[int, str] = {}

    def listener_for(index: int) -> object:
        async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
            log.record(msgs, ctx, names.get(index, "?"))
            return SUCCESS
        return listener

    first = orderly(broker.address, "jg", "hand", listener_for(0), unlock_delay_time_ms=100)
    second = orderly(broker.address, "jg", "hand", listener_for(1), unlock_delay_time_ms=100)
    async with first:
        names[0] = first.client_id or ""
        sent = await produce_keyed(broker.address, "hand", keys=20, per_key=10)
        await wait_until(lambda: log.count >= len(sent) // 2, 10)
        async with second:
            names[1] = second.client_id or ""
            await wait_until(lambda: len(first.assigned_queues("hand")) == len(second.assigned_queues("hand")) == 2,
                             10, "queues split after the handover")
            await wait_until(lambda: len(first.assigned_queues()) + len(second.assigned_queues()) == 5, 10,
                             "the retry queue owned too")
            owners = broker.locks.owners("jg")
            assert {mq for mq, cid in owners.items() if cid == names[1]} == set(second.assigned_queues())
            assert {mq for mq, cid in owners.items() if cid == names[0]} == set(first.assigned_queues())
            more = await produce_keyed(broker.address, "hand", keys=20, per_key=5, first_seq=10)
            await wait_until(lambda: log.distinct() >= len(sent) + len(more), 10)
        assert set(broker.locks.owners("jg").values()) <= {names[0]}, "the leaver unlocked its queues"
    # Each key continues in order across the handover (a re-seen suffix would repeat a number).
    for seqs in log.seen.values():
        assert sorted(set(seqs)) == list(range(15))
        assert all(b == a + 1 or b <= a for a, b in itertools.pairwise(seqs))


def test_pure_helpers() -> None:
    ctx = ConsumeOrderlyContext(MessageQueue("t", "b", 0))
    assert suspend_time_ms(ctx, 1_000) == 1_000
    ctx.suspend_current_queue_time_ms = 1
    assert suspend_time_ms(ctx, 1_000) == 10
    ctx.suspend_current_queue_time_ms = 100_000
    assert suspend_time_ms(ctx, 1_000) == 30_000
    assert orderly_max_reconsume_times(-1) == 2**31 - 1 and orderly_max_reconsume_times(3) == 3
    message = MessageExt(topic="orders", body=b"x", properties={"KEYS": "k", "MIN_OFFSET": "0"}, msg_id="ID1",
                         reconsume_times=3, flag=7)
    header = dlq_bound_header(message, "g", 3)
    assert header.topic == "%RETRY%g" and header.reconsume_times == 3 and header.max_reconsume_times == 3
    assert header.flag == 7 and header.properties[PROPERTY_RETRY_TOPIC] == "orders"
    assert header.properties[PROPERTY_ORIGIN_MESSAGE_ID] == "ID1" and "MIN_OFFSET" not in header.properties
    assert header.properties["MAX_RECONSUME_TIMES"] == "3" and header.properties["DELAY"] == "6"


async def test_a_message_failing_max_reconsume_times_goes_to_the_dlq_and_the_queue_moves_on(
        broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "poison", queue_nums=1)
    seen: list[tuple[str, int]] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        (m,) = msgs
        seen.append((m.body.decode(), m.reconsume_times))
        return SUSPEND if m.body == b"k0:1" else SUCCESS

    c = orderly(broker.address, "pg", "poison", listener, max_reconsume_times=2, suspend_current_queue_time_ms=10)
    async with c:
        await produce_keyed(broker.address, "poison", keys=1, per_key=4)
        await wait_until(lambda: ("k0:3", 0) in seen, 10, "the queue moved on past the poison message")
    assert seen == [("k0:0", 0), ("k0:1", 0), ("k0:1", 1), ("k0:1", 2), ("k0:2", 0), ("k0:3", 0)]
    assert await client_api.query_consumer_offset(broker.address, "pg", "poison", 0) == 4
    result = await client_api.pull_message(broker.address, pull_header(topic="%DLQ%pg", group="inspect"), 3_000)
    (dead,) = result.messages
    original = await client_api.view_message(broker.address, dead.properties[PROPERTY_ORIGIN_MESSAGE_ID])
    assert dead.body == original.body == b"k0:1" and dead.properties[PROPERTY_RETRY_TOPIC] == "poison"
    assert dead.reconsume_times == 2 and "DELAY" not in dead.properties
