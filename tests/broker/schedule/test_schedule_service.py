"""The schedule service delivers every due message, in order, across restarts and kill -9."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

from broker.broker import Broker
from broker.process import BrokerSubprocess
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.errors import MQError
from protocol.model import PullStatus
from protocol.topics import SCHEDULE_TOPIC
from tests.conftest import TEST_DELAY_LEVELS, broker_config
from tests.helpers import pull_header, send, wait_until

QUEUES = 4


async def drain(api: ClientAPI, address: str, topic: str, expected: set[bytes], timeout_s: float) -> Counter[bytes]:
    """Pull every queue of `topic` from offset 0 until `expected` bodies are all seen; returns the
    count of each body seen (duplicates show as counts > 1)."""
    seen: Counter[bytes] = Counter()
    offsets = [0] * QUEUES
    async with asyncio.timeout(timeout_s):
        while not expected <= set(seen):
            for queue_id in range(QUEUES):
                header = pull_header(topic=topic, queue_id=queue_id, queue_offset=offsets[queue_id],
                                     suspend_timeout_ms=50, max_msg_nums=256)
                result = await api.pull_message(address, header, 5_000)
                if result.status is PullStatus.FOUND:
                    seen.update(m.body for m in result.messages)
                offsets[queue_id] = result.next_begin_offset
    return seen


async def test_due_messages_are_delivered_in_store_order_per_level(broker: Broker, client_api: ClientAPI) -> None:
    bodies = [f"m{i}".encode() for i in range(50)]
    for body in bodies:
        await send(client_api, broker.address, "ordered", body, properties={"DELAY": "2"})
    sent_at = time.monotonic()
    received: list[bytes] = []
    async with asyncio.timeout(5):
        while len(received) < len(bodies):
            result = await client_api.pull_message(broker.address, pull_header(
                topic="ordered", queue_offset=len(received), suspend_timeout_ms=500), 5_000)
            received += [m.body for m in result.messages]
    assert received == bodies
    assert time.monotonic() - sent_at < 2
    assert broker.schedule is not None and broker.schedule.backlog(2) == 0


async def test_a_clean_restart_in_the_middle_of_a_delay_delivers_each_message_once(tmp_path: Path) -> None:
    api = ClientAPI(RemotingClient())
    bodies = {f"r{i}".encode() for i in range(200)}
    try:
        async with Broker(broker_config(tmp_path)) as broker:
            for i, body in enumerate(sorted(bodies)):
                await send(api, broker.address, "restart", body, queue_id=i % QUEUES,
                           properties={"DELAY": str(1 + i % 10)})     # 100 ms .. 1 s
            assert broker.store is not None and sum(
                broker.store.get_max_offset(SCHEDULE_TOPIC, q) for q in range(10)) == 200
        offsets = json.loads((tmp_path / "store" / "config" / "delay_offsets.json").read_text())
        assert set(offsets) == {"offset_table"}
        async with Broker(broker_config(tmp_path)) as broker:
            seen = await drain(api, broker.address, "restart", bodies, 10)
        assert set(seen) == bodies and max(seen.values()) == 1, "a clean restart duplicates nothing"
    finally:
        await api.remoting.close()


async def test_kill_9_while_delivering_skips_no_due_message(tmp_path: Path) -> None:
    store = tmp_path / "store"
    settings = {"persist_interval_ms": "100", "store.commit_log_segment_bytes": "1048576",
                "store.message_delay_level": TEST_DELAY_LEVELS}
    api = ClientAPI(RemotingClient())
    bodies: set[bytes] = set()
    proc = BrokerSubprocess(store, settings=settings)
    try:
        await proc.start()
        stop = asyncio.Event()

        async def sender(n: int) -> None:
            i = 0
            while not stop.is_set():
                body = f"s{n}-{i}".encode()
                try:
                    await send(api, proc.address, "crash", body, queue_id=i % QUEUES,
                               properties={"DELAY": str(1 + i % 5)})
                except MQError:
                    return
                bodies.add(body)
                i += 1
        senders = [asyncio.create_task(sender(n)) for n in range(4)]
        delay_file = store / "config" / "delay_offsets.json"
        await wait_until(lambda: delay_file.exists() and len(bodies) > 1_500, 30, "deliveries under way")
        proc.kill()                                      # sends and deliveries are in flight
        stop.set()
        await asyncio.wait_for(asyncio.gather(*senders), 10)
        await proc.stop()
        proc = BrokerSubprocess(store, settings=settings)
        await proc.start()
        seen = await drain(api, proc.address, "crash", bodies, 30)
        assert bodies <= set(seen), f"{len(bodies - set(seen))} acknowledged delayed messages lost"
        duplicates = sum(count - 1 for count in seen.values())
        print(f"{len(bodies)} delayed messages, {duplicates} delivered twice after kill -9")
    finally:
        await proc.stop()
        await api.remoting.close()
