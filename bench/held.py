"""`held_pulls`: the cost of 10,000 parked long-polling pulls, then of waking them all.

10 topics of 1,000 queues, one pull per queue (SUSPEND, suspend_timeout_ms 60000) over 100
connections. Once all are written, wait at least 2 s and until the broker's CPU is idle (bounded),
then measure the broker's CPU over 5 s and its RSS. Then send one message to every queue (a batch
can only hold one queue's messages, so that is one SEND_MESSAGE per queue, 64 in flight) and time
until every held pull has answered."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

from bench.broker_proc import BrokerProcess
from bench.common import PRODUCER_GROUP, Clients, connected, drive, pull_header, running_broker
from bench.report import BenchResult
from client.api import PullResult
from protocol.headers import SendMessageRequestHeader
from protocol.model import PullStatus

CPU_TARGET_FRACTION = 0.01
RSS_TARGET_MB = 100.0
SUSPEND_TIMEOUT_MS = 60_000
RPC_TIMEOUT_MS = 70_000


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldParams:
    topics: int
    queues_per_topic: int
    connections: int
    measure_s: float
    settle_min_s: float
    settle_max_s: float
    wake_time_limit_s: float

    @property
    def pulls(self) -> int:
        return self.topics * self.queues_per_topic


FULL = HeldParams(topics=10, queues_per_topic=1_000, connections=100, measure_s=5.0, settle_min_s=2.0,
                  settle_max_s=15.0, wake_time_limit_s=40.0)
QUICK = HeldParams(topics=10, queues_per_topic=100, connections=10, measure_s=2.0, settle_min_s=1.0,
                   settle_max_s=5.0, wake_time_limit_s=10.0)


async def _settle(broker: BrokerProcess, params: HeldParams) -> float:
    """Wait `settle_min_s`, then until a 0.5 s window shows < 2 % of a core (at most
    `settle_max_s` in all); returns the seconds waited."""
    started = time.monotonic()
    await asyncio.sleep(params.settle_min_s)
    while time.monotonic() - started < params.settle_max_s:
        before = broker.usage()
        await asyncio.sleep(0.5)
        if broker.usage().cores_since(before) < 0.02:
            break
    return time.monotonic() - started


async def held_pulls(result: BenchResult, quick: bool) -> None:
    params = QUICK if quick else FULL
    result.params = {**asdict(params), "pulls": params.pulls, "suspend_timeout_ms": SUSPEND_TIMEOUT_MS}
    topics = [f"bench_held_{t}" for t in range(params.topics)]
    answered_at: list[float] = []
    async with running_broker() as broker, connected(broker.address, params.connections) as pullers, \
            connected(broker.address, 4) as senders:
        address = broker.address
        for topic in topics:
            await senders[0].create_topic(address, topic, queue_nums=params.queues_per_topic)
        idle = broker.usage()
        await asyncio.sleep(1.0)
        idle_cores = broker.usage().cores_since(idle)
        rss_before_mb = broker.usage().rss_bytes / (1 << 20)

        async def hold(index: int, clients: Clients) -> PullResult:
            topic, queue_id = topics[index // params.queues_per_topic], index % params.queues_per_topic
            header = pull_header(topic, queue_id, 0, max_msg_nums=32, suspend_timeout_ms=SUSPEND_TIMEOUT_MS)
            pulled = await clients[index].pull_message(address, header, timeout_ms=RPC_TIMEOUT_MS)
            answered_at.append(time.perf_counter())
            return pulled

        write_started = time.perf_counter()
        tasks = [asyncio.create_task(hold(i, pullers)) for i in range(params.pulls)]
        await asyncio.sleep(0)   # every task has written its request by now
        write_s = time.perf_counter() - write_started
        settle_s = await _settle(broker, params)
        before = broker.usage()
        await asyncio.sleep(params.measure_s)
        after = broker.usage()
        held_cores = after.cores_since(before)
        early = len(answered_at)

        async def wake(index: int) -> int:
            topic, queue_id = topics[index // params.queues_per_topic], index % params.queues_per_topic
            header = SendMessageRequestHeader(producer_group=PRODUCER_GROUP, topic=topic, queue_id=queue_id,
                                              born_timestamp=0, properties={"TAGS": "wake"})
            await senders[index].send_message(address, header, b"wake", timeout_ms=10_000)
            return 1

        wake_started = time.perf_counter()
        sends = await drive(range(params.pulls), wake, workers=64, time_limit_s=params.wake_time_limit_s)
        sends_done = time.perf_counter()
        done, pending = await asyncio.wait(tasks, timeout=params.wake_time_limit_s)
        for task in pending:
            task.cancel()
        all_answered = time.perf_counter()
        found = sum(1 for t in done if not t.cancelled() and t.exception() is None
                    and t.result().status is PullStatus.FOUND and len(t.result().messages) == 1)
        errors = [repr(t.exception()) for t in done if not t.cancelled() and t.exception() is not None]
        rss_after_wake_mb = broker.usage().rss_bytes / (1 << 20)

    held_rss_mb = after.rss_bytes / (1 << 20)
    last_answer = max(answered_at) if answered_at else all_answered
    result.add("held_pulls.idle_cpu", round(held_cores, 4), "cores", ("≤", CPU_TARGET_FRACTION))
    result.add("held_pulls.rss", round(held_rss_mb, 1), "MB", ("≤", RSS_TARGET_MB))
    result.add("held_pulls.wake_all", round((last_answer - wake_started) * 1000, 1), "ms")
    result.add("held_pulls.answered", found, "pulls", ("≥", params.pulls))
    result.details = {
        "broker_idle_cores_before_pulls": round(idle_cores, 4),
        "rss_before_pulls_mb": round(rss_before_mb, 1),
        "rss_held_mb": round(held_rss_mb, 1), "rss_after_wake_mb": round(rss_after_wake_mb, 1),
        "rss_per_held_pull_kb": round((held_rss_mb - rss_before_mb) * 1024 / params.pulls, 2),
        "write_all_pulls_s": round(write_s, 3), "settle_s": round(settle_s, 3),
        "answered_before_wake": early, "wake_sends_s": round(sends_done - wake_started, 3),
        "wake_sends": sends.messages, "wake_send_errors": sends.errors,
        "wake_send_error_samples": sends.error_samples,
        "found": found, "pull_errors": len(errors), "pull_error_samples": errors[:5],
        "not_answered": len(pending)}
    if early:
        result.notes.append(f"{early} pulls were answered before the wake-up (not held)")
    if found != params.pulls:
        result.ok = False
        result.error = (f"{found} of {params.pulls} held pulls got their message "
                        f"({len(pending)} unanswered, {len(errors)} errors, {sends.errors} send errors)")
