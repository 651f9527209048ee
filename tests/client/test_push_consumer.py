"""PushConsumer against a real broker: rebalance on join/leave, takeover after a kill, broadcasting,
consume-from rules, flow control and the local retry of failed messages."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from broker.broker import Broker
from broker.topics.topic_config_manager import TopicConfig
from client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from client.api import ClientAPI
from conf.client import ClientConfig
from protocol.codes import Perm
from tests.helpers import wait_until

FAST = ClientConfig(persist_offset_interval_ms=200)
OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS


class Collector:
    """A listener recording every consumed message's UNIQ_KEY (thread-safe)."""

    def __init__(self) -> None:
        self.keys: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        with self.lock:
            self.keys.update(m.uniq_key or "" for m in msgs)
        return OK


async def produce(address: str, topic: str, count: int, batch: int = 32) -> list[str]:
    keys: list[str] = []
    async with Producer("pg", address) as producer:
        for start in range(0, count, batch):
            result = await producer.send_batch([Message(topic, f"{i}".encode())
                                                for i in range(start, min(count, start + batch))])
            keys.extend(result.uniq_keys)
    return keys


def consumer(address: str, group: str, topic: str, listener: object, config: ClientConfig = FAST,
             **options: object) -> PushConsumer:
    c = PushConsumer(group, address, client_config=config,
                     consume_from_where=str(options.pop("consume_from_where", "CONSUME_FROM_FIRST_OFFSET")),
                     **options)  # type: ignore[arg-type]
    c.subscribe(topic)
    c.register_listener(listener)  # type: ignore[arg-type]
    return c


def assert_partition(consumers: list[PushConsumer], queues: list[MessageQueue]) -> None:
    owned = [q for c in consumers for q in c.assigned_queues(queues[0].topic)]
    assert sorted(owned) == sorted(queues), "every queue owned exactly once"


async def test_join_and_leave_rebalance_within_one_second(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "rb", queue_nums=8)
    queues = [MessageQueue("rb", broker.config.broker_name, i) for i in range(8)]
    first = consumer(broker.address, "rbg", "rb", Collector())
    async with first:
        await wait_until(lambda: first.assigned_queues("rb") == queues, 1.0, "first owns all queues")
        second = consumer(broker.address, "rbg", "rb", Collector())
        async with second:
            started = time.perf_counter()
            await wait_until(lambda: len(first.assigned_queues("rb")) == 4 and len(second.assigned_queues("rb")) == 4,
                             1.0, "a join splits the queues within 1 s")
            assert time.perf_counter() - started < 1.0
            assert_partition([first, second], queues)
            assert not set(first.assigned_queues("rb")) & set(second.assigned_queues("rb"))
        await wait_until(lambda: first.assigned_queues("rb") == queues, 1.0, "a leave hands queues back within 1 s")


async def test_a_killed_consumer_loses_no_message(broker: Broker, client_api: ClientAPI, tmp_path: Path) -> None:
    await client_api.create_topic(broker.address, "kill", queue_nums=8)
    outfile = tmp_path / "consumed.txt"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.client.consumer_process", broker.address, "killg", "kill", str(outfile),
        stdout=asyncio.subprocess.PIPE, cwd=os.getcwd())
    survivor_keys = Collector()
    survivor = consumer(broker.address, "killg", "kill", survivor_keys)
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 20)).strip() == b"READY"
        async with survivor:
            await wait_until(lambda: len(survivor.assigned_queues("kill")) == 4, 5, "queues split between both")
            sent = await produce(broker.address, "kill", 2_000)
            await wait_until(lambda: outfile.exists() and outfile.stat().st_size > 0, 10, "victim consumed")
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
            sent += await produce(broker.address, "kill", 2_000)

            def all_consumed() -> bool:
                victim = set(outfile.read_text().split())
                return set(sent) <= victim | set(survivor_keys.keys)
            await wait_until(all_consumed, 20, "every message consumed by the victim or the survivor")
            assert len(survivor.assigned_queues("kill")) == 8
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def test_broadcasting_delivers_every_message_to_every_member(broker: Broker, tmp_path: Path) -> None:
    collectors = [Collector(), Collector()]
    # Broadcasting keeps the instance name (no pid suffix), so two members in one process need names.
    members = [consumer(broker.address, "bcast", "bc", c, ClientConfig(instance_name=f"member{i}"),
                        message_model="BROADCASTING", offset_store_dir=tmp_path / f"offsets{i}")
               for i, c in enumerate(collectors)]
    await produce(broker.address, "bc", 1)            # creates the topic
    async with members[0], members[1]:
        sent = await produce(broker.address, "bc", 500)
        for c in collectors:
            await wait_until(lambda c=c: set(sent) <= set(c.keys), 10, "each member got everything")  # type: ignore[misc]
        assert all(len(m.assigned_queues("bc")) == 4 for m in members)
    assert list((tmp_path / "offsets0").rglob("offsets.json")), "broadcast offsets kept locally"


async def test_failed_messages_come_back_through_the_retry_topic(broker: Broker, client_api: ClientAPI) -> None:
    attempts: Counter[str] = Counter()
    seen: list[tuple[str, str, int]] = []

    def flaky(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus | None:
        key = msgs[0].uniq_key or ""
        attempts[key] += 1
        seen.append((key, msgs[0].topic, msgs[0].reconsume_times))
        if msgs[0].body == b"3" and attempts[key] == 1:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        if msgs[0].body == b"4" and attempts[key] == 1:
            raise RuntimeError("listener bug")
        return OK

    await client_api.create_topic(broker.address, "flaky", queue_nums=1)
    c = consumer(broker.address, "flakyg", "flaky", flaky)
    async with c:
        sent = await produce(broker.address, "flaky", 10)
        mq = MessageQueue("flaky", broker.config.broker_name, 0)

        def drained() -> bool:
            pq = c.process_queue(mq)
            return pq is not None and pq.msg_count == 0 and attempts[sent[9]] >= 1
        # Sent back, 3 and 4 no longer hold the offset: the queue drains before they come back.
        await wait_until(drained, 5, "failed messages sent back")
        await wait_until(lambda: attempts[sent[3]] == 2 and attempts[sent[4]] == 2, 5, "retried via %RETRY%")
        await c.persist_offsets()
    assert await client_api.query_consumer_offset(broker.address, "flakyg", "flaky", 0) == 10
    retried = [(topic, times) for key, topic, times in seen if key in (sent[3], sent[4])]
    assert sorted(retried) == [("flaky", 0), ("flaky", 0), ("flaky", 1), ("flaky", 1)]


async def test_failed_messages_are_retried_locally_when_the_broker_refuses_them(
        broker: Broker, client_api: ClientAPI) -> None:
    attempts: Counter[str] = Counter()

    def flaky(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus | None:
        key = msgs[0].uniq_key or ""
        attempts[key] += 1
        return ConsumeConcurrentlyStatus.RECONSUME_LATER if msgs[0].body == b"3" and attempts[key] == 1 else OK

    await client_api.create_topic(broker.address, "local", queue_nums=1)
    # A read-only retry topic: the send-back and the resend are both refused (NO_PERMISSION). Set
    # in the broker itself: clients may not create or change a %RETRY% topic.
    broker.topics.update(TopicConfig(topic="%RETRY%localg", read_queue_nums=1, write_queue_nums=1, perm=Perm.READ))
    c = consumer(broker.address, "localg", "local", flaky, reconsume_later_delay_ms=200)
    async with c:
        sent = await produce(broker.address, "local", 10)
        await wait_until(lambda: all(attempts[k] >= 1 for k in sent), 5)
        pq = c.process_queue(MessageQueue("local", broker.config.broker_name, 0))
        assert pq is not None
        await wait_until(lambda: attempts[sent[3]] == 2, 5, "retried locally")
        await wait_until(lambda: pq.msg_count == 0, 5)
    assert await client_api.query_consumer_offset(broker.address, "localg", "local", 0) == 10


async def test_flow_control_bounds_a_slow_consumers_cache(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "fc", queue_nums=4)
    await produce(broker.address, "fc", 100_000, batch=256)
    release = threading.Event()

    def slow(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        release.wait(0.002)
        return OK

    c = consumer(broker.address, "fcg", "fc", slow, pull_threshold_for_queue=100, consume_thread_min=4,
                 consume_thread_max=4)
    peak_count = 0
    async with c:
        await wait_until(lambda: len(c.assigned_queues("fc")) == 4, 5)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            for mq in c.assigned_queues("fc"):
                pq = c.process_queue(mq)
                if pq is not None:
                    peak_count = max(peak_count, pq.msg_count)
            await asyncio.sleep(0.005)
        release.set()
    # The check runs before each pull: a queue can exceed the threshold by at most one batch.
    assert 100 < peak_count <= 100 + 32, peak_count


async def test_consumer_survives_a_broker_restart(tmp_path: Path) -> None:
    from tests.conftest import broker_config
    from tests.helpers import free_port
    config = broker_config(tmp_path, listen_port=free_port())   # restarted on it: below the ephemeral range
    keys = Collector()
    async with Broker(config) as first_run:
        address = first_run.address
        before = await produce(address, "restart", 100)
        c = consumer(address, "rsg", "restart", keys, pull_time_delay_when_exception_ms=200)
        await c.start()
        await wait_until(lambda: set(before) <= set(keys.keys), 5, "consumed before the restart")
    try:
        async with Broker(config) as second_run:
            after = await produce(second_run.address, "restart", 100)
            await wait_until(lambda: set(after) <= set(keys.keys), 10, "consumed after the restart")
    finally:
        await c.shutdown()


async def test_consume_from_first_last_and_timestamp(tmp_path: Path) -> None:
    """A new group's start offset. With the first message "in disk" (ratio 0 here), the broker has
    no offset to offer and `consume_from_where` decides; on a young queue RocketMQ (and rocketq by
    default) answers 0 whatever it says."""
    from conf.store import StoreConfig
    from tests.conftest import broker_config
    store = StoreConfig(path=tmp_path / "store", access_message_in_memory_max_ratio=0,
                        commit_log_segment_bytes=1024 * 1024)
    async with Broker(broker_config(tmp_path, store=store)) as broker:
        old = await produce(broker.address, "cf", 40)        # q0 gets old[:32], q1 gets old[32:]
        boundary_ms = (int(time.time()) + 1) * 1000            # consume_timestamp has 1 s resolution
        await asyncio.sleep(boundary_ms / 1000 - time.time() + 0.01)   # wall clock, not synchronisation
        middle = await produce(broker.address, "cf", 40)
        results: dict[str, Collector] = {}
        for where in ("CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_TIMESTAMP"):
            stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(boundary_ms / 1000))
            keys = results[where] = Collector()
            c = consumer(broker.address, f"g-{where[13:17]}", "cf", keys, consume_from_where=where,
                         consume_timestamp=stamp)
            async with c:
                await wait_until(lambda c=c: len(c.assigned_queues("cf")) == 4, 5)  # type: ignore[misc]
                new = await produce(broker.address, "cf", 8)
                await wait_until(lambda keys=keys, new=new: set(new) <= set(keys.keys), 5)  # type: ignore[misc]
            results[where].keys.subtract(new)
        first = {k for k, n in results["CONSUME_FROM_FIRST_OFFSET"].keys.items() if n > 0}
        last = {k for k, n in results["CONSUME_FROM_LAST_OFFSET"].keys.items() if n > 0}
        stamped = {k for k, n in results["CONSUME_FROM_TIMESTAMP"].keys.items() if n > 0}
        assert set(old) | set(middle) <= first
        assert not last & (set(old) | set(middle))
        # the search answers the message nearest to the timestamp, which may be a queue's last old one
        assert set(middle) <= stamped and stamped & set(old) <= {old[31], old[39]}
