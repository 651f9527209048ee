"""A flood of fake client ids heartbeating into one group: membership and client ids per host are
bounded (SYSTEM_BUSY past them), NOTIFY_CONSUMER_IDS_CHANGED is coalesced per group, and a real
consumer of the group and a producer carry on meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker.broker import Broker
from broker.process import BrokerSubprocess
from chaos.heartbeat_flood import FakeMember
from client import MessageExt, MessageQueue, PushConsumer
from client.api import ClientAPI
from tests.client.test_push_consumer import FAST, OK
from tests.conftest import broker_config
from tests.helpers import wait_until

FAKES = 1_000
GROUP_CAP = 200
ADDRESS_CAP = 400
WINDOW_MS = 500


async def test_a_heartbeat_flood_is_bounded_and_coalesced_while_a_real_consumer_carries_on(
        tmp_path: Path, client_api: ClientAPI) -> None:
    """1,000 fake client ids (one raw connection each) heartbeat into the group of a real consumer.
    Before: every join notified every member (n²/2 frames: ~500,000 here), all 1,000 joined, and
    sends waited seconds. Now: 200 members (max_consumers_per_group), 400 client ids from this
    host (max_client_ids_per_address), at most 4 notice rounds per 500 ms window."""
    settings = {"max_consumers_per_group": str(GROUP_CAP), "max_client_ids_per_address": str(ADDRESS_CAP),
                "notify_consumer_ids_changed_interval_ms": str(WINDOW_MS),
                "max_connections_per_address": "0"}     # the fakes' 1,000 connections: not this bound's test
    async with BrokerSubprocess(tmp_path / "store", settings=settings) as broker:
        await client_api.create_topic(broker.address, "ft", queue_nums=8)
        received: list[bytes] = []

        def listener(msgs: list[MessageExt], ctx: object) -> object:
            received.extend(m.body for m in msgs)
            return OK
        real = PushConsumer("flood", broker.address, client_config=FAST, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        real.subscribe("ft")
        real.register_listener(listener)  # type: ignore[arg-type]
        queue_0 = MessageQueue("ft", "broker-a", 0)
        async with real:
            await wait_until(lambda: queue_0 in real.assigned_queues("ft"), 5.0, "the real consumer owns queue 0")
            fakes = [FakeMember(f"flood-{n:05d}", "flood", "ft") for n in range(FAKES)]
            latencies_ms: list[float] = []
            started = time.monotonic()
            try:
                sending = asyncio.create_task(_send_to(client_api, broker.address, queue_0, latencies_ms))
                for start in range(0, FAKES, 100):       # (the real consumer sorts first: it keeps queue 0)
                    await asyncio.gather(*(f.connect(broker.address) for f in fakes[start:start + 100]))
                    for fake in fakes[start:start + 100]:
                        fake.heartbeat()
                await wait_until(lambda: all(f.answers == 1 for f in fakes), 20.0, "every answer")
                flood_s = time.monotonic() - started
                # the last joins are announced too, by the round that ends their window
                await wait_until(lambda: all(f.notices for f in fakes if f.accepted), 3 * WINDOW_MS / 1000,
                                 "every member told")
                sending.cancel()
                sent = await asyncio.gather(sending, return_exceptions=True)
                members = await client_api.get_consumer_id_list(broker.address, "flood")
                await wait_until(lambda: len(received) >= len(latencies_ms), 10.0, "the real consumer got them")
            finally:
                await asyncio.gather(*(f.close() for f in fakes))
    assert isinstance(sent[0], asyncio.CancelledError)
    accepted = sum(f.accepted for f in fakes)
    remarks = {f.remark.rsplit("(", 1)[-1] for f in fakes if f.refused}
    assert accepted == GROUP_CAP - 1 and len(members) == GROUP_CAP
    assert remarks == {"max_consumers_per_group)", "max_client_ids_per_address)"}
    rounds = 4 * (flood_s * 1000 / WINDOW_MS + 2)
    notices = sum(f.notices for f in fakes)
    assert notices <= rounds * GROUP_CAP, f"{notices} notices in {flood_s:.1f} s"
    assert max(f.notices for f in fakes) <= rounds
    assert {f"m{i}".encode() for i in range(len(latencies_ms))} <= set(received)
    p99_ms = sorted(latencies_ms)[int(len(latencies_ms) * 0.99)]
    # before: sends waited seconds (16.4 s in the run). The probe shares this test's loop with
    # the 1,000 fakes' connections, so its latency carries the test's own load, and its ~10 sends make
    # the "p99" their slowest: 50 ms held alone but failed at 55 ms with other work on the machine,
    # 250 ms failed at 363 ms in a pure-Python CI run (34-144 ms in five runs alone); 1 s still tells
    # a stall of seconds from none.
    assert p99_ms < 1_000, f"p99 send {p99_ms:.1f} ms"


async def _send_to(api: ClientAPI, address: str, queue: MessageQueue, latencies_ms: list[float]) -> None:
    """Send m0, m1, ... to `queue` one at a time until cancelled, recording each latency."""
    while True:
        started = time.perf_counter()
        await api.send_message_to(address, queue, "pg", f"m{len(latencies_ms)}".encode(), {})
        latencies_ms.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.005)


async def test_a_client_id_past_the_address_bound_is_refused_and_freed_when_it_disconnects(tmp_path: Path) -> None:
    async with Broker(broker_config(tmp_path, max_client_ids_per_address=2, max_consumers_per_group=0)) as broker:
        fakes = [FakeMember(f"c{n}", "g", "t") for n in range(3)]
        try:
            for fake in fakes:
                await fake.connect(broker.address)
                await _answered_heartbeat(fake)
            assert [f.accepted for f in fakes] == [1, 1, 0] and "max_client_ids_per_address" in fakes[2].remark
            await fakes[0].close()
            await wait_until(lambda: broker.client_ids.client_ids("127.0.0.1") == 1, 2.0, "c0 gone")
            await _answered_heartbeat(fakes[2])
            assert fakes[2].accepted == 1
        finally:
            await asyncio.gather(*(f.close() for f in fakes))


async def _answered_heartbeat(fake: FakeMember) -> None:
    expected = fake.answers + 1
    fake.heartbeat()
    await wait_until(lambda: fake.answers == expected, 2.0, f"{fake.client_id}'s heartbeat answered")
