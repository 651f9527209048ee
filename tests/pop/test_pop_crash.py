"""Broker kill -9 with popped, unacked messages: after a restart on the same store they come back
(after their invisible time, as attempt 2), acked ones never do, and the pop offset holds (nothing
popped before the crash is handed out as new). A crash seconds after an invisible-time change keeps
the change."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker.broker import Broker
from broker.process import BrokerSubprocess
from client import MessageView, SimpleConsumer
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from tests.conftest import broker_config
from tests.helpers import send

TOPIC = "crashpop"


async def test_popped_unacked_messages_come_back_after_a_kill_9(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = BrokerSubprocess(store, settings={"persist_interval_ms": "60000",     # replay, not the snapshot
                                             "store.commit_log_segment_bytes": "1048576",
                                             "store.consume_queue_segment_units": "1000"})
    await proc.start()
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    try:
        await api.create_topic(proc.address, TOPIC, 1)
        for i in range(20):
            await send(api, proc.address, TOPIC, f"m{i}".encode())
        async with SimpleConsumer("cg", proc.address, subscriptions={TOPIC: "*"}, await_duration_s=1) as c:
            popped = await c.receive(10, invisible_duration_s=2)
            assert [m.body for m in popped] == [f"m{i}".encode() for i in range(10)]
            await asyncio.gather(*(c.ack(m) for m in popped[:4]))       # one BATCH_ACK_MESSAGE
            await c.ack(popped[4])                                         # one ACK_MESSAGE
            kept = popped[5]
            await c.change_invisible_duration(kept, 6)     # a change just before the crash
            proc.kill()
            popped_at = time.monotonic()
    finally:
        await proc.stop()
        await remoting.close()

    async with Broker(broker_config(tmp_path, pop_revive_interval_ms=20)) as broker, \
            SimpleConsumer("cg", broker.address, subscriptions={TOPIC: "*"}, await_duration_s=0.5) as c:
        fresh = await c.receive(32, invisible_duration_s=30)
        assert [m.body for m in fresh] == [f"m{i}".encode() for i in range(10, 20)]
        assert all(m.delivery_attempt == 1 for m in fresh)
        back: list[MessageView] = []
        async with asyncio.timeout(15):
            while len(back) < 5:
                back += await c.receive(32, invisible_duration_s=30)
        elapsed = time.monotonic() - popped_at
        bodies = sorted(m.body for m in back)
        assert bodies == [f"m{i}".encode() for i in range(5, 10)]       # never m0..m4 (acked)
        assert all(m.delivery_attempt == 2 for m in back)
        assert elapsed >= 5.5           # m5's changed invisible time (6 s) held across the crash
        for message in fresh + back:
            await c.ack(message)
        assert await c.receive(32, invisible_duration_s=30) == []
