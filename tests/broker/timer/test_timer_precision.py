"""Timer messages with the real client: each arrives in [its time, its time + 1 s], also under a
consumer slower than the deliveries. The full run (100,000 over 60 s) is opt-in:
`RQ_TIMER_FULL=1 pytest tests/broker/timer/test_timer_precision.py` (`make timer-full`)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.broker import Broker
from client import ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from tests.conftest import broker_config
from tests.helpers import wait_until

FULL = os.environ.get("RQ_TIMER_FULL") == "1"


async def send_all(producer: Producer, messages: list[Message], concurrency: int = 64) -> None:
    queue = iter(messages)

    async def worker() -> None:
        for message in queue:
            await producer.send(message)
    await asyncio.gather(*(worker() for _ in range(concurrency)))


@pytest.mark.parametrize(("count", "spread_s"), [
    (10_000, 10),
    pytest.param(100_000, 60, marks=[pytest.mark.skipif(not FULL, reason="opt-in: RQ_TIMER_FULL=1"),
                                     pytest.mark.timeout(400)]),
])
async def test_messages_spread_over_the_next_seconds_each_arrive_within_a_second_of_their_time(
        tmp_path: Path, count: int, spread_s: int) -> None:
    received: dict[bytes, tuple[int, float]] = {}
    copies: Counter[bytes] = Counter()

    def listener(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
        now = time.time()
        for m in msgs:
            copies[m.body] += 1
            received.setdefault(m.body, (m.store_timestamp, now))
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    async with Broker(broker_config(tmp_path)) as broker:
        consumer = PushConsumer("timer-g", broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                consume_message_batch_max_size=32)
        consumer.subscribe("timed")
        consumer.register_listener(listener)
        async with consumer, Producer("timer-pg", broker.address) as producer:
            lead_ms = 3_000 + count * 2 // 5     # sending (~4,000/s in one process with the broker) ends first
            start = int(time.time() * 1000) + lead_ms
            messages = [Message("timed", f"{i}@{start + i * spread_s * 1000 // count}".encode(),
                                deliver_time_ms=start + i * spread_s * 1000 // count) for i in range(count)]
            await send_all(producer, messages)
            assert time.time() * 1000 < start, "sending took longer than the lead"
            await wait_until(lambda: len(received) == count, spread_s + lead_ms / 1000 + 15, "all delivered")
    late_ms = sorted(int(at * 1000) - int(body.split(b"@")[1]) for body, (_, at) in received.items())
    early = [body for body, (stored, _) in received.items() if stored < int(body.split(b"@")[1])]
    p99 = late_ms[len(late_ms) * 99 // 100]
    print(f"{count} timer messages over {spread_s} s: lateness at the consumer p50 {late_ms[len(late_ms) // 2]} ms, "
          f"p99 {p99} ms, max {late_ms[-1]} ms; {sum(copies.values()) - count} repeats")
    assert not early, f"{len(early)} stored in their topic before their time"
    assert late_ms[-1] <= 1_000, f"a message arrived {late_ms[-1]} ms after its time"
    assert max(copies.values()) == 1


async def test_a_consumer_slower_than_the_deliveries_gets_each_once_and_stops_gracefully(tmp_path: Path) -> None:
    got: Counter[bytes] = Counter()
    early: list[bytes] = []

    async def slow(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
        await asyncio.sleep(0.002 * len(msgs))          # the work: ~500 messages/s
        for m in msgs:
            got[m.body] += 1
            if m.store_timestamp < int(m.body.split(b"@")[1]):
                early.append(m.body)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    async with Broker(broker_config(tmp_path)) as broker:
        consumer = PushConsumer("slow-g", broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                consume_thread_min=1, consume_thread_max=1)
        consumer.subscribe("slow")
        consumer.register_listener(slow)
        async with Producer("slow-pg", broker.address) as producer:
            due = int(time.time() * 1000) + 1_000
            await send_all(producer, [Message("slow", f"{i}@{due}".encode(), deliver_time_ms=due)
                                      for i in range(1_500)])
            await consumer.start()
            try:
                await wait_until(lambda: broker.timer is not None and broker.timer.delivered == 1_500, 10,
                                 "all delivered by the broker")
                assert len(got) < 1_500, "the consumer is behind the deliveries"
                await wait_until(lambda: len(got) == 1_500, 20, "all consumed")
            finally:
                await consumer.shutdown()
    assert max(got.values()) == 1 and not early


async def test_a_client_message_carries_its_times_and_a_batch_refuses_them(broker: Broker) -> None:
    message = Message("t", b"x", deliver_time_ms=1_800_000_000_000)
    assert message.wire_properties()["TIMER_DELIVER_MS"] == "1800000000000"
    assert Message("t", b"x", delay_time_ms=5_000).wire_properties()["TIMER_DELAY_MS"] == "5000"
    async with Producer("pg", broker.address) as producer:
        with pytest.raises(ValueError, match="timer messages one by one"):
            await producer.send_batch([Message("t", b"a", delay_time_ms=10), Message("t", b"b")])
