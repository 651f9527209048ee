"""FIFO POP: in a group created with consume_message_orderly, each message group's messages are
processed in order by 4 SimpleConsumers sharing the topic, also when one consumer (a process of
its own) is killed -9 holding popped, unacked messages: they come back after the invisible time,
before anything after them in their group."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client import SimpleConsumer
from client.api import ClientAPI
from client.producer.producer import Producer
from protocol.headers import CreateSubscriptionGroupRequestHeader
from protocol.message import Message
from tests.conftest import broker_config
from tests.helpers import wait_until

TOPIC = "fifo"
GROUPS = 8
PER_GROUP = 40


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(broker_config(tmp_path, pop_revive_interval_ms=20)) as running:
        yield running


async def fifo_setup(broker: Broker, client_api: ClientAPI, group: str) -> None:
    await client_api.create_topic(broker.address, TOPIC, 4)
    await client_api.create_subscription_group(broker.address, CreateSubscriptionGroupRequestHeader(
        group_name=group, consume_message_orderly=True))
    async with Producer("pg", broker.address) as producer:
        for seq in range(PER_GROUP):
            for g in range(GROUPS):
                await producer.send(Message(TOPIC, f"g{g}:{seq}".encode(), message_group=f"g{g}"))


def collapse(seqs: list[int]) -> list[int]:
    """Consecutive repeats (a message processed again after its consumer died unacked) removed."""
    return [s for i, s in enumerate(seqs) if i == 0 or seqs[i - 1] != s]


def by_group(lines: list[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for line in lines:
        g, seq = line.split(":")
        groups[g].append(int(seq))
    return groups


async def run_consumers(broker: Broker, group: str, processed: list[str], until: int, count: int = 4) -> None:
    async def run(c: SimpleConsumer) -> None:
        while len(set(processed)) < until:
            for message in await c.receive(4, invisible_duration_s=2):
                assert message.message_group == message.body.decode().split(":")[0]
                processed.append(message.body.decode())
                await asyncio.sleep(0)       # let other consumers interleave
                await c.ack(message)

    consumers = [SimpleConsumer(group, broker.address, subscriptions={TOPIC: "*"}, await_duration_s=0.2)
                 for _ in range(count)]
    for c in consumers:
        await c.start()
    try:
        await asyncio.wait_for(asyncio.gather(*(run(c) for c in consumers)), timeout=60)
    finally:
        for c in consumers:
            await c.shutdown()


async def test_fifo_groups_keep_their_order_under_four_consumers(broker: Broker, client_api: ClientAPI) -> None:
    await fifo_setup(broker, client_api, "fifo-g")
    processed: list[str] = []
    await run_consumers(broker, "fifo-g", processed, GROUPS * PER_GROUP)
    groups = by_group(processed)
    assert len(groups) == GROUPS
    for seqs in groups.values():
        assert seqs == list(range(PER_GROUP))        # no consumer died: exactly once, in order


async def test_fifo_order_survives_a_consumer_killed_9(broker: Broker, client_api: ClientAPI,
                                                        tmp_path: Path) -> None:
    await fifo_setup(broker, client_api, "fifo-k")
    outfile = tmp_path / "killed.txt"
    outfile.touch()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.pop.pop_consumer_process", broker.address, "fifo-k", TOPIC, str(outfile),
        stdout=asyncio.subprocess.PIPE, cwd=os.getcwd())
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), timeout=20) == b"READY\n"
        await wait_until(lambda: len(outfile.read_text().splitlines()) >= 10, 20, "the process consumed some")
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert broker.pop_service is not None
    in_flight = sum(len(s.in_flight) for s in broker.pop_service.queues.values())
    assert in_flight > 0           # it died holding popped, unacked messages
    killed = outfile.read_text().splitlines()
    processed = list(killed)
    await run_consumers(broker, "fifo-k", processed, GROUPS * PER_GROUP)
    for seqs in by_group(processed).values():
        assert collapse(seqs) == list(range(PER_GROUP))     # each group in order, nothing lost
