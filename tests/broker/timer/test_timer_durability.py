"""Timer messages survive restarts and kill -9: none lost, none delivered before its time."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from broker.broker import Broker
from broker.process import BrokerSubprocess
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.clock import SystemClock
from protocol.errors import MQError
from protocol.model import PullStatus
from protocol.topics import TIMER_TOPIC
from tests.conftest import broker_config
from tests.helpers import pull_header, send, wait_until

QUEUES = 4
DAY_MS = 86_400_000


class ShiftedClock(SystemClock):
    """The system clock moved `shift_ms` ahead (a broker started "two days later")."""

    def __init__(self, shift_ms: int) -> None:
        self.shift_ms = shift_ms

    def now_ms(self) -> int:
        return super().now_ms() + self.shift_ms


async def drain(api: ClientAPI, address: str, topic: str, expected: set[bytes],
                timeout_s: float) -> tuple[Counter[bytes], list[tuple[bytes, int]]]:
    """Pull every queue of `topic` until the `expected` bodies are all seen: each body's count and
    (body, store_timestamp) of every copy: when the broker put it into its topic."""
    seen: Counter[bytes] = Counter()
    stored: list[tuple[bytes, int]] = []
    offsets = [0] * QUEUES
    async with asyncio.timeout(timeout_s):
        while not expected <= set(seen):
            for queue_id in range(QUEUES):
                header = pull_header(topic=topic, queue_id=queue_id, queue_offset=offsets[queue_id],
                                     suspend_timeout_ms=50, max_msg_nums=256)
                result = await api.pull_message(address, header, 5_000)
                if result.status is PullStatus.FOUND:
                    seen.update(m.body for m in result.messages)
                    stored += [(m.body, m.store_timestamp) for m in result.messages]
                offsets[queue_id] = result.next_begin_offset
    return seen, stored


def due_of(body: bytes) -> int:
    return int(body.split(b"@")[1])


async def test_kill_9_while_scheduling_and_delivering_loses_none_and_delivers_none_early(tmp_path: Path) -> None:
    store = tmp_path / "store"
    settings = {"store.commit_log_segment_bytes": "4194304"}
    api = ClientAPI(RemotingClient())
    bodies: set[bytes] = set()
    proc = BrokerSubprocess(store, settings=settings)
    try:
        await proc.start()
        stop = asyncio.Event()
        started_ms = int(time.time() * 1000)

        async def sender(n: int) -> None:
            i = 0
            while not stop.is_set():
                due = int(time.time() * 1000) + 200 + (i * 37 + n * 101) % 2_500
                body = f"k{n}-{i}@{due}".encode()
                try:
                    await send(api, proc.address, "crash", body, queue_id=i % QUEUES,
                               properties={"TIMER_DELIVER_MS": str(due)})
                except MQError:
                    return
                bodies.add(body)
                i += 1
        senders = [asyncio.create_task(sender(n)) for n in range(4)]
        checkpoint = store / "timer" / "timercheck.json"
        await wait_until(lambda: checkpoint.exists() and int(time.time() * 1000) > started_ms + 1_500
                         and len(bodies) > 1_000, 30, "scheduling and deliveries under way")
        proc.kill()                                      # sends, enqueues and deliveries in flight
        stop.set()
        await asyncio.wait_for(asyncio.gather(*senders), 10)
        await proc.stop()
        proc = BrokerSubprocess(store, settings=settings)
        await proc.start()
        seen, stored = await drain(api, proc.address, "crash", bodies, 30)
        assert bodies <= set(seen), f"{len(bodies - set(seen))} acknowledged timer messages lost"
        early = [(body, at) for body, at in stored if at < due_of(body)]
        assert not early, f"{len(early)} delivered before their time, e.g. {early[:3]}"
        duplicates = sum(count - 1 for count in seen.values())
        print(f"{len(bodies)} timer messages, {duplicates} delivered twice after kill -9")
    finally:
        await proc.stop()
        await api.remoting.close()


async def test_a_message_two_days_ahead_survives_restarts_and_is_delivered_when_its_day_comes(
        tmp_path: Path) -> None:
    api = ClientAPI(RemotingClient())
    due = int(time.time() * 1000) + 2 * DAY_MS
    try:
        async with Broker(broker_config(tmp_path)) as broker:
            await send(api, broker.address, "later", b"two days", properties={"TIMER_DELIVER_MS": str(due)})
            assert broker.timer is not None
            await wait_until(lambda: broker.timer is not None and broker.timer.state.scheduled(due).records == 1,
                             5, "scheduled in the wheel")
        for _ in range(2):                                 # two restarts: still scheduled, not delivered
            async with Broker(broker_config(tmp_path)) as broker:
                assert broker.timer is not None and broker.store is not None
                state = broker.timer.state
                slot = state.scheduled(due)
                assert slot.records == 1
                record = state.log.read(slot.head_pos)
                assert record is not None and record.deliver_ms == due
                assert state.enqueue_queue_offset == 1
                assert broker.store.get_max_offset("later", 0) == 0
        async with Broker(broker_config(tmp_path), clock=ShiftedClock(2 * DAY_MS - 2_000)) as broker:
            assert broker.store is not None
            await asyncio.sleep(0)
            assert broker.store.get_max_offset("later", 0) == 0, "delivered 2 s early"
            seen, stored = await drain(api, broker.address, "later", {b"two days"}, 10)
            assert seen == Counter({b"two days": 1}) and stored[0][1] >= due
    finally:
        await api.remoting.close()


async def test_a_clean_restart_delivers_each_message_once(tmp_path: Path) -> None:
    api = ClientAPI(RemotingClient())
    try:
        bodies: set[bytes] = set()
        async with Broker(broker_config(tmp_path)) as broker:
            now = int(time.time() * 1000)
            for i in range(300):
                due = now + 300 + i * 5
                bodies.add(f"o{i}@{due}".encode())
                await send(api, broker.address, "once", f"o{i}@{due}".encode(), queue_id=i % QUEUES,
                           properties={"TIMER_DELIVER_MS": str(due)})
            assert broker.store is not None and broker.store.get_max_offset(TIMER_TOPIC, 0) == 300
        async with Broker(broker_config(tmp_path)) as broker:
            seen, stored = await drain(api, broker.address, "once", bodies, 10)
        assert max(seen.values()) == 1 and all(at >= due_of(body) for body, at in stored)
    finally:
        await api.remoting.close()
