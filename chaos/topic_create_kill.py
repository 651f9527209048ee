"""Fault kind "kill -9 within 1 s of a topic create": topics created and at once written to, then the
broker killed before its periodic persist could run; after each restart every topic created so far
must exist with its queue count and every acknowledged message must be pullable.

Call it with a running broker subprocess on a store of its own (it kills and restarts it):

    async with BrokerSubprocess(store_dir) as broker:
        result = await topic_create_kill(broker, duration_s=10)
    assert result.topics_lost == 0 and result.lost == 0, result

Each cycle: UPDATE_AND_CREATE_TOPIC of `made<n>` with `queue_nums` queues, `messages_per_queue`
sends to each of its queues, then a send that auto-creates `auto<n>` and one send to each of its
queues, then SIGKILL (right after the last answer: about `kill_after_create_ms` after the create),
then a restart on the same store and a check of every topic so far (route: exists, queue count).
Cycles go on until `duration_s` has passed (at least one); then every acknowledged message is
pulled back (by topic, queue and queue offset)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from broker.process import BrokerSubprocess
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.codes import PullSysFlag
from protocol.errors import MQError
from protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from protocol.model import PullStatus

Acked = dict[tuple[str, int, int], bytes]
"""(topic, queue_id, queue_offset) → body of every acknowledged message."""


@dataclass(frozen=True, slots=True)
class TopicCreateKillResult:
    cycles: int                     # kill -9 / restart cycles
    topics_created: int             # topics created (admin or auto) and answered before a kill
    acknowledged: int               # messages acknowledged before a kill
    topics_lost: int                # checks after restarts that found a topic missing or narrower
    lost: int                       # acknowledged messages not pullable at the end
    kill_after_create_ms: float     # the longest time from a create's request to its kill


async def send_to(api: ClientAPI, address: str, topic: str, queue_id: int, body: bytes, acked: Acked) -> None:
    """One SEND_MESSAGE; on its answer, record it in `acked`. Raises the send's `MQError`."""
    header = SendMessageRequestHeader(producer_group="chaos_pg", topic=topic, queue_id=queue_id, flag=0,
                                      born_timestamp=int(time.time() * 1000), properties={})
    result = await api.send_message(address, header, body)
    acked[(topic, queue_id, result.queue_offset)] = body


async def pull_queue(api: ClientAPI, address: str, topic: str, queue_id: int) -> dict[int, bytes]:
    """queue_offset → body of every message of one queue (from 0, no subscription filter)."""
    found: dict[int, bytes] = {}
    queue_offset = 0
    while True:
        header = PullMessageRequestHeader(
            consumer_group="chaos_check", topic=topic, queue_id=queue_id, queue_offset=queue_offset,
            max_msg_nums=32, sys_flag=PullSysFlag.SUBSCRIPTION, commit_offset=0, suspend_timeout_ms=0,
            sub_version=0, subscription="*", expression_type="TAG")
        result = await api.pull_message(address, header, 5_000)
        if result.status is not PullStatus.FOUND:
            return found
        found.update((m.queue_offset, m.body) for m in result.messages)
        queue_offset = result.next_begin_offset


async def count_lost(api: ClientAPI, address: str, acked: Acked) -> int:
    """How many of `acked` are not pulled back as acknowledged (a missing topic loses them all)."""
    stored: dict[tuple[str, int], dict[int, bytes]] = {}
    for topic, queue_id in {(t, q) for t, q, _ in acked}:
        try:
            stored[(topic, queue_id)] = await pull_queue(api, address, topic, queue_id)
        except MQError:
            stored[(topic, queue_id)] = {}
    return sum(stored[(t, q)].get(o) != body for (t, q, o), body in acked.items())


async def count_topics_lost(api: ClientAPI, address: str, expected: dict[str, int]) -> int:
    """Topics of `expected` (name → queue count) the broker does not route, or with fewer queues."""
    lost = 0
    for topic, queue_nums in expected.items():
        try:
            route = await api.get_route_info(address, topic)
        except MQError:
            lost += 1
            continue
        if min(q.read_queue_nums for q in route.queue_datas) < queue_nums:
            lost += 1
    return lost


async def topic_create_kill(broker: BrokerSubprocess, duration_s: float, *, queue_nums: int = 8,
                            messages_per_queue: int = 2, min_cycles: int = 1) -> TopicCreateKillResult:
    """Run the cycles of the module docstring on `broker` (started; left running, restarted, at
    the end), at least `min_cycles` of them however long they take (a loaded machine). Raises
    `MQError` when a create or send before a kill fails (the broker was healthy)."""
    expected: dict[str, int] = {}
    acked: Acked = {}
    cycles = topics_lost = 0
    slowest_ms = 0.0
    deadline = time.monotonic() + duration_s
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    try:
        while cycles < max(1, min_cycles) or time.monotonic() < deadline:
            made, auto, address = f"made{cycles}", f"auto{cycles}", broker.address
            started = time.monotonic()
            await api.create_topic(address, made, queue_nums=queue_nums)
            expected[made] = queue_nums
            for queue_id in range(queue_nums):
                for index in range(messages_per_queue):
                    await send_to(api, address, made, queue_id, b"%s-%d-%d" % (made.encode(), queue_id, index), acked)
            await send_to(api, address, auto, 0, b"first", acked)        # auto-created by this send
            auto_queues = min(q.write_queue_nums for q in (await api.get_route_info(address, auto)).queue_datas)
            expected[auto] = auto_queues
            for queue_id in range(auto_queues):
                await send_to(api, address, auto, queue_id, b"%s-%d" % (auto.encode(), queue_id), acked)
            broker.kill()
            slowest_ms = max(slowest_ms, (time.monotonic() - started) * 1000)
            await broker.stop()
            cycles += 1
            await broker.start()
            topics_lost += await count_topics_lost(api, broker.address, expected)
        lost = await count_lost(api, broker.address, acked)
    finally:
        await remoting.close()
    return TopicCreateKillResult(cycles=cycles, topics_created=len(expected), acknowledged=len(acked),
                                 topics_lost=topics_lost, lost=lost, kill_after_create_ms=slowest_ms)
