"""Long polling: a held pull wakes when a matching message arrives, ends at its deadline, and is
answered at once when the broker stops."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker.broker import Broker
from client.api import ClientAPI
from conf.broker import LongPollingConfig
from protocol.model import PullStatus
from tests.conftest import broker_config
from tests.helpers import held_pulls, pull_header, send


async def test_held_pull_wakes_when_a_message_arrives(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "lp")            # topic exists, queue 0 at offset 1
    header = pull_header(topic="lp", queue_offset=1, suspend_timeout_ms=10_000)
    pull = asyncio.create_task(client_api.pull_message(broker.address, header, timeout_ms=15_000))
    await held_pulls(broker, topic="lp", count=1)
    started = time.perf_counter()
    await send(client_api, broker.address, "lp", b"wake")
    result = await asyncio.wait_for(pull, timeout=1)
    assert time.perf_counter() - started < 0.5
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"wake"]
    assert result.next_begin_offset == 2


async def test_held_pull_ends_at_its_deadline(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "lpt")
    started = time.perf_counter()
    result = await client_api.pull_message(
        broker.address, pull_header(topic="lpt", queue_offset=1, suspend_timeout_ms=300), timeout_ms=5_000)
    elapsed = time.perf_counter() - started
    assert result.status is PullStatus.NO_NEW_MSG and result.next_begin_offset == 1
    assert 0.3 <= elapsed < 0.4, elapsed


async def test_a_non_matching_message_does_not_wake_a_filtered_pull(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "lpf", tags="A")
    header = pull_header(topic="lpf", queue_offset=1, suspend_timeout_ms=10_000, subscription="A")
    pull = asyncio.create_task(client_api.pull_message(broker.address, header, timeout_ms=15_000))
    await held_pulls(broker, topic="lpf", count=1)
    await send(client_api, broker.address, "lpf", b"b", tags="B")
    done, _ = await asyncio.wait({pull}, timeout=0.2)
    assert not done, "a message with another tag woke the pull"
    await send(client_api, broker.address, "lpf", b"a", tags="A")
    result = await asyncio.wait_for(pull, timeout=1)
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"a"]
    assert result.next_begin_offset == 3


async def test_stop_answers_every_held_pull_at_once(tmp_path: Path, client_api: ClientAPI) -> None:
    broker = Broker(broker_config(tmp_path))
    await broker.start()
    try:
        await send(client_api, broker.address, "lps")
        pulls = [asyncio.create_task(client_api.pull_message(
            broker.address, pull_header(topic="lps", queue_offset=1, suspend_timeout_ms=30_000), 35_000))
            for _ in range(20)]
        await held_pulls(broker, topic="lps", count=20)
    finally:
        started = time.perf_counter()
        await broker.stop()
    results = await asyncio.wait_for(asyncio.gather(*pulls), timeout=2)
    assert time.perf_counter() - started < 2
    assert all(r.status is PullStatus.NO_NEW_MSG for r in results)


async def test_short_polling_when_long_polling_is_off(tmp_path: Path, client_api: ClientAPI) -> None:
    config = broker_config(tmp_path, long_polling=LongPollingConfig(enable=False, short_polling_time_ms=200))
    async with Broker(config) as broker:
        await send(client_api, broker.address, "sp")
        header = pull_header(topic="sp", queue_offset=1, suspend_timeout_ms=10_000)
        pull = asyncio.create_task(client_api.pull_message(broker.address, header, timeout_ms=15_000))
        await held_pulls(broker, topic="sp", count=1)
        await send(client_api, broker.address, "sp", b"later")
        result = await asyncio.wait_for(pull, timeout=2)
        # Not woken by the arrival: answered at the short-polling deadline with what is there then.
        assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"later"]


async def test_suspend_with_zero_timeout_does_not_hold(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "z")
    header = pull_header(topic="z", queue_offset=1, suspend_timeout_ms=0, sys_flag=0x2 | 0x4)
    result = await asyncio.wait_for(client_api.pull_message(broker.address, header, 5_000), timeout=1)
    assert result.status is PullStatus.NO_NEW_MSG
