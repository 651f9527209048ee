"""A push consumer whose listener is slower than the backlog, the ordinary production case: the
committed offset follows the messages as they finish (RocketMQ `ProcessQueue.removeMessage`), flow
control does not count as a stalled pull, a stalled pull goes on without rewinding, and a graceful
stop leaves the committed offset at what finished. Real broker, real consumer, over TCP."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import pytest

from broker.broker import Broker
from client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from client.api import ClientAPI
from conf.client import ClientConfig
from protocol.errors import QueryNotFound
from protocol.model import MessageQueue
from tests.helpers import wait_until

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
PERSIST_MS = 300
QUEUES = 4
PER_QUEUE = 48
RESTART_LOG = "restarting its pull"


class SlowListener:
    """Takes `call_s` per call (sleeping in its thread, or awaiting when `is_async`), recording when
    each call started and each message finished, by (queue_id, queue_offset)."""

    def __init__(self, call_s: float) -> None:
        self.call_s = call_s
        self.lock = threading.Lock()
        self.started: list[float] = []
        self.finished: dict[tuple[int, int], list[float]] = {}

    def _record(self, msgs: list[MessageExt]) -> None:
        now = time.monotonic()
        with self.lock:
            for m in msgs:
                self.finished.setdefault((m.queue_id, m.queue_offset), []).append(now)

    def sync(self, msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        with self.lock:
            self.started.append(time.monotonic())
        time.sleep(self.call_s)
        self._record(msgs)
        return OK

    async def async_(self, msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        self.started.append(time.monotonic())
        await asyncio.sleep(self.call_s)
        self._record(msgs)
        return OK

    def prefix(self, queue_id: int, before: float = float("inf")) -> int:
        """The lowest offset of `queue_id` not finished by `before`: what may be committed then."""
        with self.lock:
            offset = 0
            while any(t <= before for t in self.finished.get((queue_id, offset), ())):
                offset += 1
            return offset

    def count(self) -> int:
        with self.lock:
            return len(self.finished)


async def fill(address: str, broker_name: str, topic: str) -> None:
    async with Producer("slow-pg", address) as producer:
        for queue_id in range(QUEUES):
            for _ in range(PER_QUEUE // 16):
                await producer.send_batch([Message(topic, b"x" * 64) for _ in range(16)],
                                          queue=MessageQueue(topic, broker_name, queue_id))


async def committed(api: ClientAPI, address: str, group: str, topic: str) -> list[int]:
    offsets = []
    for queue_id in range(QUEUES):
        try:
            offsets.append(await api.query_consumer_offset(address, group, topic, queue_id, 3_000))
        except QueryNotFound:
            offsets.append(0)
    return offsets


def slow_consumer(address: str, group: str, topic: str, listener: Callable[..., object], *, threads: int,
                  batch: int, **options: object) -> PushConsumer:
    c = PushConsumer(group, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     client_config=ClientConfig(persist_consumer_offset_interval_ms=PERSIST_MS,
                                                rebalance_interval_ms=200),
                     consume_thread_min=threads, consume_thread_max=threads, consume_message_batch_max_size=batch,
                     pull_batch_size=8, pull_threshold_for_queue=4, broker_suspend_max_ms=200,
                     pull_max_idle_time_ms=600, **options)  # type: ignore[arg-type]
    c.subscribe(topic)
    c.register_listener(listener)  # type: ignore[arg-type]
    return c


@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("threads", [1, 20])
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_slow_listener_commits_as_it_goes_and_stops_at_what_finished(
        broker: Broker, client_api: ClientAPI, kind: str, threads: int, batch: int,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="client.consumer")
    topic, group = "slow", f"slow-{kind}-{threads}-{batch}"
    await client_api.create_topic(broker.address, topic, queue_nums=QUEUES)
    await fill(broker.address, broker.config.broker_name, topic)
    total = QUEUES * PER_QUEUE
    # far slower than the pulls (flow control holds each queue to one pulled batch of 8)
    call_s = {(1, 1): 0.02, (20, 1): 0.08, (1, 32): 0.1, (20, 32): 0.25}[(threads, batch)]
    listener = SlowListener(call_s)
    first = slow_consumer(broker.address, group, topic, listener.sync if kind == "sync" else listener.async_,
                          threads=threads, batch=batch, await_termination_millis_when_shutdown=10_000)
    await first.start()
    try:
        # 1. the broker's committed offsets catch up with what finished within the persist interval
        await wait_until(lambda: listener.count() >= total // 8, 20, "an eighth of the backlog consumed")
        asked_at = time.monotonic()
        target = [listener.prefix(q, asked_at) for q in range(QUEUES)]
        assert sum(target) > 0
        while True:
            now = time.monotonic()
            offsets = await committed(client_api, broker.address, group, topic)
            ceiling = [listener.prefix(q) for q in range(QUEUES)]
            assert all(o <= c for o, c in zip(offsets, ceiling, strict=True)), \
                f"committed {offsets} ahead of what finished {ceiling}"
            if all(o >= t for o, t in zip(offsets, target, strict=True)):
                break
            assert now - asked_at < PERSIST_MS / 1000 + 1.5, f"committed {offsets} still behind {target}"
            await asyncio.sleep(0.02)
        assert first.flow_control_times > 0, "the test must engage flow control"
        # 2. a graceful stop in the middle of the backlog
        await wait_until(lambda: listener.count() >= total // 4, 20, "a quarter of the backlog consumed")
    finally:
        stop_at = time.monotonic()
        await first.shutdown()
    assert listener.count() < total, "the stop must come with a backlog left"
    assert all(t <= time.monotonic() for t in listener.started)
    assert not [t for t in listener.started if t > stop_at], "a listener call started after the stop began"
    prefixes = [listener.prefix(q) for q in range(QUEUES)]
    assert await committed(client_api, broker.address, group, topic) == prefixes
    assert not [m for m, times in listener.finished.items() if len(times) > 1], "consumed twice"
    assert RESTART_LOG not in caplog.text, "flow control was taken for a stalled pull"

    # 3. the next consumer of the group goes on from there: a message comes twice only where a
    # concurrent consumer had finished it above a message that had not (a hole in the prefix)
    above = {m for m in listener.finished if m[1] >= prefixes[m[0]]}
    assert threads > 1 or not above, f"one thread finishes in order, yet {sorted(above)} finished above"
    second_listener = SlowListener(0)
    second = slow_consumer(broker.address, group, topic, second_listener.sync, threads=4, batch=1)
    async with second:
        await wait_until(lambda: second_listener.count() + len(set(listener.finished) - above) >= total, 20,
                         "the rest consumed")
    again = set(listener.finished) & set(second_listener.finished)
    assert again <= above, f"consumed twice: {sorted(again - above)}"
    assert set(listener.finished) | set(second_listener.finished) == {(q, o) for q in range(QUEUES)
                                                                     for o in range(PER_QUEUE)}


async def test_stalled_pull_goes_on_from_its_offset_keeping_finished_results(
        broker: Broker, client_api: ClientAPI, caplog: pytest.LogCaptureFixture) -> None:
    """A pull held longer than `pull_max_idle_time_ms` (a real stall by RocketMQ's rule, shortened
    here) while the listener still works through the cache: the pull restarts from the offset it
    was pulling, the process queue and its results kept, so nothing is consumed twice."""
    caplog.set_level(logging.WARNING, logger="client.consumer")
    await client_api.create_topic(broker.address, "stall", queue_nums=1)
    async with Producer("stall-pg", broker.address) as producer:
        await producer.send_batch([Message("stall", f"{i}".encode()) for i in range(40)])
    listener = SlowListener(0.03)
    consumer = PushConsumer("stall-g", broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            client_config=ClientConfig(persist_consumer_offset_interval_ms=PERSIST_MS,
                                                       rebalance_interval_ms=100),
                            consume_thread_min=1, consume_thread_max=1, pull_max_idle_time_ms=300,
                            broker_suspend_max_ms=15_000)
    consumer.subscribe("stall")
    consumer.register_listener(listener.sync)
    async with consumer:
        await wait_until(lambda: len(consumer.assigned_queues("stall")) == 1, 5, "the queue assigned")
        mq = consumer.assigned_queues("stall")[0]
        pq = consumer.process_queue(mq)
        await wait_until(lambda: RESTART_LOG in caplog.text, 5, "the held pull taken for a stall")
        assert listener.count() < 40, "the restart must come while the listener works"
        await wait_until(lambda: listener.count() == 40, 10, "all 40 consumed")
        async with Producer("stall-pg", broker.address) as producer:
            await producer.send_batch([Message("stall", b"late") for _ in range(5)])
        await wait_until(lambda: listener.count() == 45, 10, "the 5 late ones consumed")
        assert consumer.process_queue(mq) is pq, "the process queue was kept"
    assert not [m for m, times in listener.finished.items() if len(times) > 1], "consumed twice"
    assert await client_api.query_consumer_offset(broker.address, "stall-g", "stall", 0, 3_000) == 45


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_slow_orderly_listener_commits_as_it_goes_and_stops_at_what_finished(
        broker: Broker, client_api: ClientAPI, kind: str) -> None:
    topic, group = "slow-orderly", f"slow-orderly-{kind}"
    await client_api.create_topic(broker.address, topic, queue_nums=QUEUES)
    await fill(broker.address, broker.config.broker_name, topic)
    total = QUEUES * PER_QUEUE
    listener = SlowListener(0.02)

    def sync(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        listener.sync(msgs, None)  # type: ignore[arg-type]
        return ConsumeOrderlyStatus.SUCCESS

    async def async_(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        await listener.async_(msgs, None)  # type: ignore[arg-type]
        return ConsumeOrderlyStatus.SUCCESS

    consumer = slow_consumer(broker.address, group, topic, sync if kind == "sync" else async_, threads=1, batch=1,
                             await_termination_ms=5_000)
    consumer.register_listener(sync if kind == "sync" else async_, orderly=True)
    await consumer.start()
    try:
        await wait_until(lambda: listener.count() >= total // 8, 20, "an eighth of the backlog consumed")
        asked_at = time.monotonic()
        target = [listener.prefix(q, asked_at) for q in range(QUEUES)]
        async with asyncio.timeout(PERSIST_MS / 1000 + 1.5):
            while not all(o >= t for o, t in zip(await committed(client_api, broker.address, group, topic), target,
                                                 strict=True)):
                await asyncio.sleep(0.02)
        await wait_until(lambda: listener.count() >= total // 4, 20, "a quarter of the backlog consumed")
    finally:
        stop_at = time.monotonic()
        await consumer.shutdown()
    assert listener.count() < total, "the stop must come with a backlog left"
    assert not [t for t in listener.started if t > stop_at], "a listener call started after the stop began"
    assert await committed(client_api, broker.address, group, topic) == [listener.prefix(q) for q in range(QUEUES)]
    assert not [m for m, times in listener.finished.items() if len(times) > 1], "consumed twice"


async def test_one_slow_thread_with_default_thresholds_finishes_each_queue_in_order(
        broker: Broker, client_api: ClientAPI) -> None:
    """#34's first case at default flow-control thresholds (1,000 messages a queue, so every queue's
    backlog is cached at once): one thread calls the listener in the order the batches were
    pulled, so each queue finishes from its lowest offset up and what finished is what may be
    committed, give or take the one batch a thread takes while it hands the others back. (Batches a
    thread handed back used to queue behind newer pulls: 598 consumed, 160 committable.)"""
    topic, group = "slow-default", "slow-default-g"
    await client_api.create_topic(broker.address, topic, queue_nums=QUEUES)
    await fill(broker.address, broker.config.broker_name, topic)
    listener = SlowListener(0.004)
    consumer = PushConsumer(group, broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            client_config=ClientConfig(persist_consumer_offset_interval_ms=PERSIST_MS),
                            consume_thread_min=1, consume_thread_max=1, pull_batch_size=8)
    consumer.subscribe(topic)
    consumer.register_listener(listener.sync)
    async with consumer:
        await wait_until(lambda: listener.count() >= QUEUES * PER_QUEUE // 2, 20, "half of the backlog consumed")
        consumed = listener.count()
        prefixes = [listener.prefix(q) for q in range(QUEUES)]
    assert consumed - sum(prefixes) <= 8 + 1, f"{consumed} consumed, only {prefixes} committable"
