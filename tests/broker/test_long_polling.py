"""Long polling: a held pull wakes when a matching message arrives, ends at its deadline, and is
answered at once when the broker stops."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from broker.broker import Broker
from broker.longpoll.hold_service import HoldService
from client.api import ClientAPI
from conf.broker import LongPollingConfig
from protocol.headers import SendBatchMessageRequestHeader
from protocol.message import Message, encode_batch_body
from protocol.model import PullStatus
from tests.conftest import broker_config
from tests.helpers import held_pulls, pull_header, send


def _hold(broker: Broker) -> HoldService:
    assert broker.hold_service is not None
    return broker.hold_service


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


async def test_pulls_sharing_a_deadline_tick_each_end_at_their_own_deadline(broker: Broker,
                                                                              client_api: ClientAPI) -> None:
    for queue_id in range(3):
        await send(client_api, broker.address, "lpd", queue_id=queue_id)
    started = time.perf_counter()
    answered_s: dict[int, float] = {}

    async def pull(queue_id: int, suspend_timeout_ms: int) -> PullStatus:
        result = await client_api.pull_message(broker.address, pull_header(
            topic="lpd", queue_id=queue_id, queue_offset=1, suspend_timeout_ms=suspend_timeout_ms), timeout_ms=5_000)
        answered_s[queue_id] = time.perf_counter() - started
        return result.status

    # queues 0 and 1 share a deadline (and almost surely its 10 ms tick); queue 2's is later
    pulls = [asyncio.create_task(pull(0, 300)), asyncio.create_task(pull(1, 300)), asyncio.create_task(pull(2, 500))]
    for queue_id in range(3):
        await held_pulls(broker, topic="lpd", count=1, queue_id=queue_id)
    await send(client_api, broker.address, "lpd", b"wake", queue_id=0)
    assert await asyncio.wait_for(pulls[0], timeout=1) is PullStatus.FOUND
    assert answered_s[0] < 0.25, answered_s            # woken, long before the shared deadline
    assert await asyncio.wait_for(pulls[1], timeout=2) is PullStatus.NO_NEW_MSG
    assert await asyncio.wait_for(pulls[2], timeout=2) is PullStatus.NO_NEW_MSG
    assert 0.3 <= answered_s[1] < 0.4 and 0.5 <= answered_s[2] < 0.6, answered_s
    assert _hold(broker).held_count == 0 and _hold(broker).deadline_timers == 0


async def test_waking_every_held_pull_leaves_no_deadline_timer(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "lpw")
    pulls = [asyncio.create_task(client_api.pull_message(broker.address, pull_header(
        topic="lpw", queue_offset=1, suspend_timeout_ms=10_000 + 7 * i), timeout_ms=15_000)) for i in range(20)]
    await held_pulls(broker, topic="lpw", count=20)
    assert _hold(broker).deadline_timers >= 2        # deadlines 7 ms apart span several ticks
    await send(client_api, broker.address, "lpw", b"wake")
    results = await asyncio.wait_for(asyncio.gather(*pulls), timeout=2)
    assert all(r.status is PullStatus.FOUND for r in results)
    assert _hold(broker).held_count == 0 and _hold(broker).deadline_timers == 0


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


async def test_a_batch_wakes_a_filtered_pull_by_its_matching_message(broker: Broker, client_api: ClientAPI) -> None:
    """A batch is dispatched as one run and told to the hold service once: a pull held with a tag
    filter wakes only for a batch holding a matching message, and reads from its first match."""
    await send(client_api, broker.address, "lpb", tags="A")
    header = pull_header(topic="lpb", queue_offset=1, suspend_timeout_ms=10_000, subscription="A")
    pull = asyncio.create_task(client_api.pull_message(broker.address, header, timeout_ms=15_000))
    await held_pulls(broker, topic="lpb", count=1)
    batch = SendBatchMessageRequestHeader(producer_group="pg", topic="lpb", queue_id=0)
    await client_api.send_batch(broker.address, batch, encode_batch_body([Message("lpb", b"b", tags="B")] * 3))
    done, _ = await asyncio.wait({pull}, timeout=0.2)
    assert not done, "a batch with other tags only woke the pull"
    await client_api.send_batch(broker.address, batch, encode_batch_body(
        [Message("lpb", b"b", tags="B"), Message("lpb", b"a1", tags="A"), Message("lpb", b"a2", tags="A")]))
    result = await asyncio.wait_for(pull, timeout=1)
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"a1", b"a2"]
    assert result.next_begin_offset == 7


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


async def test_one_arrival_answers_every_matching_pull_held_at_its_place(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "lpm", tags="A")
    headers = [pull_header(topic="lpm", queue_offset=1, suspend_timeout_ms=10_000, group=group, subscription=sub)
               for group, sub in [("g1", "*"), ("g1", "*"), ("g2", "*"), ("g3", "A"), ("g3", "A || C"),
                                  ("g4", "B")]]
    pulls = [asyncio.create_task(client_api.pull_message(broker.address, h, timeout_ms=15_000)) for h in headers]
    await held_pulls(broker, topic="lpm", count=len(pulls))
    await send(client_api, broker.address, "lpm", b"a", tags="A")
    results = await asyncio.wait_for(asyncio.gather(*pulls[:5]), timeout=1)
    for result in results:
        assert result.status is PullStatus.FOUND and result.next_begin_offset == 2
        assert [(m.body, m.queue_offset, m.tags) for m in result.messages] == [(b"a", 1, "A")]
    assert not pulls[5].done(), "the message with tag A woke the pull subscribed to B"
    await held_pulls(broker, topic="lpm", count=1)
    await send(client_api, broker.address, "lpm", b"b", tags="B")
    result = await asyncio.wait_for(pulls[5], timeout=1)
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"b"]


async def test_a_woken_pull_is_answered_before_the_send_that_woke_it(tmp_path: Path, client_api: ClientAPI) -> None:
    """Both on one connection, the send acknowledged at once (ASYNC_FLUSH): the pull's response
    leaves first, so by the time the send's acknowledgement is read, the pull has its message."""
    config = broker_config(tmp_path)
    async with Broker(replace(config, store=replace(config.store, flush_disk_type="ASYNC_FLUSH"))) as broker:
        await send(client_api, broker.address, "lpo")
        header = pull_header(topic="lpo", queue_offset=1, suspend_timeout_ms=10_000)
        pull = asyncio.create_task(client_api.pull_message(broker.address, header, timeout_ms=15_000))
        await held_pulls(broker, topic="lpo", count=1)
        await send(client_api, broker.address, "lpo", b"now")
        assert pull.done(), "the send was acknowledged before the held pull was answered"
        assert [m.body for m in pull.result().messages] == [b"now"]


async def test_pulls_held_at_different_offsets_each_get_their_own_read(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "lpd")
    filtered = asyncio.create_task(client_api.pull_message(
        broker.address, pull_header(topic="lpd", queue_offset=1, suspend_timeout_ms=10_000, subscription="B"),
        timeout_ms=15_000))
    await held_pulls(broker, topic="lpd", count=1)
    await send(client_api, broker.address, "lpd", b"a", tags="A")          # offset 1: does not wake it
    everything = asyncio.create_task(client_api.pull_message(
        broker.address, pull_header(topic="lpd", queue_offset=2, suspend_timeout_ms=10_000), timeout_ms=15_000))
    await held_pulls(broker, topic="lpd", count=2)
    await send(client_api, broker.address, "lpd", b"b", tags="B")          # offset 2 wakes both
    first, second = await asyncio.wait_for(asyncio.gather(filtered, everything), timeout=1)
    assert first.status is PullStatus.FOUND and [(m.body, m.queue_offset) for m in first.messages] == [(b"b", 2)]
    assert second.status is PullStatus.FOUND and [(m.body, m.queue_offset) for m in second.messages] == [(b"b", 2)]
    assert first.next_begin_offset == second.next_begin_offset == 3
