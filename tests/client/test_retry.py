"""Retry, dead-letter queue and delayed delivery end to end: real brokers, real PushConsumers
(REFERENCE.md §9, §10). Delay level N is N x 100 ms in these brokers (tests/conftest.py), so the
retry gaps are 300, 400, 500 ms ... (level 3 + reconsume_times)."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from broker.broker import Broker
from broker.process import BrokerSubprocess
from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.client import ClientConfig
from protocol.errors import TopicNotExist
from protocol.headers import PullMessageRequestHeader
from tests.conftest import TEST_DELAY_LEVELS
from tests.helpers import free_port, pull_header, wait_until

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
LEVEL_MS = 100
FAST_CLIENT = ClientConfig(persist_offset_interval_ms=200)


class Deliveries:
    """Every listener call: (uniq key, topic, reconsume_times, monotonic seconds)."""

    def __init__(self, fail_times: int) -> None:
        self.fail_times = fail_times
        self.calls: list[tuple[str, str, int, float]] = []
        self.attempts: Counter[str] = Counter()

    def __call__(self, msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        message = msgs[0]
        key = message.uniq_key or ""
        self.calls.append((key, message.topic, message.reconsume_times, time.monotonic()))
        self.attempts[key] += 1
        return LATER if self.attempts[key] <= self.fail_times else OK


def push_consumer(address: str, group: str, topic: str, listener: object, **options: object) -> PushConsumer:
    consumer = PushConsumer(group, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            client_config=FAST_CLIENT, **options)  # type: ignore[arg-type]
    consumer.subscribe(topic)
    consumer.register_listener(listener)  # type: ignore[arg-type]
    return consumer


async def dlq_messages(api: ClientAPI, address: str, group: str) -> int:
    try:
        return await api.get_max_offset(address, f"%DLQ%{group}", 0)
    except TopicNotExist:
        return 0


async def send_one(address: str, topic: str, body: bytes = b"x", delay_level: int = 0) -> str:
    async with Producer("retry-producers", address) as producer:
        message = Message(topic, body)
        message.delay_time_level = delay_level
        result = await producer.send(message)
        return result.uniq_keys[0]


async def test_an_always_failing_message_is_retried_on_the_levels_then_dead_lettered(
        broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "orders")
    deliveries = Deliveries(fail_times=1_000)
    consumer = push_consumer(broker.address, "poison", "orders", deliveries, max_reconsume_times=3)
    async with consumer:
        key = await send_one(broker.address, "orders", b"poison")
        await wait_until(lambda: len(deliveries.calls) == 4, 10, "1 delivery + 3 retries")
        await wait_until(lambda: consumer._send_back is not None and consumer._send_back.sent_back == 4, 5)
        dead = await dlq_messages(client_api, broker.address, "poison")
    assert dead == 1
    assert [(k, topic, times) for k, topic, times, _ in deliveries.calls] == [
        (key, "orders", 0), (key, "orders", 1), (key, "orders", 2), (key, "orders", 3)]
    at = [t for *_, t in deliveries.calls]
    for times, (before, after) in enumerate(itertools.pairwise(at)):
        expected_ms = (3 + times) * LEVEL_MS
        gap_ms = (after - before) * 1000
        assert abs(gap_ms - expected_ms) <= max(0.2 * expected_ms, 100), (times, gap_ms, expected_ms)
    result = await client_api.pull_message(broker.address, _dlq_pull("poison"), 5_000)
    (letter,) = result.messages
    assert letter.body == b"poison" and letter.properties["RETRY_TOPIC"] == "orders"
    assert letter.properties["ORIGIN_MESSAGE_ID"] and letter.uniq_key == key


async def test_a_message_that_fails_twice_then_succeeds_is_seen_three_times(
        broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "orders")
    deliveries = Deliveries(fail_times=2)
    async with push_consumer(broker.address, "twice", "orders", deliveries):
        key = await send_one(broker.address, "orders")
        await wait_until(lambda: deliveries.attempts[key] == 3, 10, "2 retries then success")
        await asyncio.sleep(0.6)          # a fourth delivery would come 500 ms later: it must not
    assert [times for _, _, times, _ in deliveries.calls] == [0, 1, 2]
    assert await dlq_messages(client_api, broker.address, "twice") == 0


async def test_producer_delayed_messages_arrive_no_earlier_than_their_level(
        broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "later")
    arrived: list[MessageExt] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        arrived.extend(msgs)
        return OK

    async with push_consumer(broker.address, "delayed", "later", listener):
        for level in (2, 5, 8):
            await send_one(broker.address, "later", str(level).encode(), delay_level=level)
        await wait_until(lambda: len(arrived) == 3, 10, "three delayed messages")
    for message in arrived:
        level = int(message.body)
        assert message.store_timestamp - message.born_timestamp >= level * LEVEL_MS - 1, message
        assert message.topic == "later" and "DELAY" not in message.properties
    assert [int(m.body) for m in arrived] == [2, 5, 8]


async def test_a_consume_timeout_sends_the_stuck_message_back_and_the_offset_moves_on(
        broker: Broker, client_api: ClientAPI) -> None:
    release = threading.Event()
    calls: list[tuple[bytes, int]] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        calls.append((msgs[0].body, msgs[0].reconsume_times))
        if msgs[0].body == b"stuck" and msgs[0].reconsume_times == 0:
            release.wait(30)              # a listener call that hangs
        return OK

    await client_api.create_topic(broker.address, "slow", queue_nums=1)
    consumer = push_consumer(broker.address, "slowg", "slow", listener, consume_timeout_minutes=0.01)  # 600 ms
    try:
        async with consumer:
            for body in (b"stuck", b"a", b"b"):
                await send_one(broker.address, "slow", body)
            await wait_until(lambda: (b"stuck", 1) in calls, 10, "the stuck message came back")
            await consumer.persist_offsets()
            assert await client_api.query_consumer_offset(broker.address, "slowg", "slow", 0) == 3
            release.set()
    finally:
        release.set()
    assert {(b"a", 0), (b"b", 0), (b"stuck", 0), (b"stuck", 1)} <= set(calls)


async def test_dlq_resend_brings_a_message_back_to_a_healthy_listener(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "orders")
    deliveries = Deliveries(fail_times=1_000)
    async with push_consumer(broker.address, "mend", "orders", deliveries, max_reconsume_times=0):
        key = await send_one(broker.address, "orders", b"fix-me")
        await wait_until(lambda: deliveries.attempts[key] == 1, 5)
        async with asyncio.timeout(5):
            while await dlq_messages(client_api, broker.address, "mend") < 1:
                await asyncio.sleep(0.01)
        listed = await admin(broker.address, "dlq", "list", "--group", "mend", "--json")
        assert [(row["topic"], row["resent"]) for row in listed] == [("orders", False)]
        deliveries.fail_times = 0          # the bug is fixed
        resent = await admin(broker.address, "dlq", "resend", "--group", "mend", "--all", "--json")
        assert [row["topic"] for row in resent] == ["orders"]
        await wait_until(lambda: deliveries.attempts[key] == 2, 5, "the resent copy is consumed")
        assert await admin(broker.address, "dlq", "resend", "--group", "mend", "--all", "--json") == []
        assert [row["resent"] for row in await admin(broker.address, "dlq", "list", "-g", "mend", "--json")] == [True]
    assert deliveries.calls[-1][1:3] == ("orders", 0)


async def test_retries_survive_a_broker_restart_and_a_kill_9_in_the_middle_of_their_delay(tmp_path: Path) -> None:
    """Level 3 (the first retry) is 2 s here, so the broker goes down while every retry waits."""
    levels = "100ms 200ms 2s " + " ".join(TEST_DELAY_LEVELS.split()[3:])
    settings = {"persist_interval_ms": "100", "store.commit_log_segment_bytes": "1048576",
                "store.message_delay_level": levels}
    port = _free_port()
    deliveries = Deliveries(fail_times=1)
    for stop in ("sigterm", "kill"):
        proc = BrokerSubprocess(tmp_path / stop, settings=settings, listen_port=port)
        await proc.start()
        await _create_topic(proc.address, "orders")
        group, sent = f"survive-{stop}", []
        consumer = push_consumer(proc.address, group, "orders", deliveries)
        try:
            async with consumer:
                async with Producer("retry-producers", proc.address) as producer:
                    for i in range(20):
                        sent.append((await producer.send(Message("orders", f"{stop}-{i}".encode()))).uniq_keys[0])
                await wait_until(lambda: all(deliveries.attempts[k] >= 1 for k in sent), 10,  # noqa: B023
                                 "every message failed once")
                send_back = consumer._send_back
                assert send_back is not None
                await wait_until(lambda: send_back.sent_back >= 20, 10, "all 20 sent back")  # noqa: B023
                if stop == "kill":
                    proc.kill()
                await proc.stop()
                proc = BrokerSubprocess(tmp_path / stop, settings=settings, listen_port=port)
                await proc.start()
                await wait_until(lambda: all(deliveries.attempts[k] >= 2 for k in sent), 30,  # noqa: B023
                                 f"every retry delivered after the {stop}")
        finally:
            await proc.stop()
        if stop == "sigterm":           # after a kill -9 a retry may come twice (at least once)
            assert all(deliveries.attempts[k] == 2 for k in sent)


def _dlq_pull(group: str) -> PullMessageRequestHeader:
    return pull_header(topic=f"%DLQ%{group}", group="reader")


async def admin(address: str, *args: str) -> list[dict[str, object]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rocketq", "admin", *args, "--endpoints", address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()
    rows: list[dict[str, object]] = json.loads(stdout)
    return rows


async def _create_topic(address: str, topic: str) -> None:
    api = ClientAPI(RemotingClient())
    try:
        await api.create_topic(address, topic)
    finally:
        await api.remoting.close()


def _free_port() -> int:
    return free_port()      # below the ephemeral range: no outgoing connection takes it meanwhile


async def test_ack_index_acknowledges_part_of_a_batch(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "partial", queue_nums=1)
    async with Producer("retry-producers", broker.address) as producer:
        await producer.send_batch([Message("partial", str(i).encode()) for i in range(4)])
    seen: list[tuple[list[bytes], int]] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        seen.append(([m.body for m in msgs], msgs[0].reconsume_times))
        if msgs[0].reconsume_times == 0:
            ctx.ack_index = 1                  # the first two are consumed, the rest come back
            ctx.delay_level_when_next_consume = 1
        return OK

    async with push_consumer(broker.address, "partialg", "partial", listener, consume_message_batch_max_size=4):
        await wait_until(lambda: sum(len(bodies) for bodies, _ in seen) == 6, 10, "2 consumed, 2 retried")
    assert seen[0] == ([b"0", b"1", b"2", b"3"], 0)
    assert sorted(body for bodies, times in seen[1:] for body in bodies if times == 1) == [b"2", b"3"]
