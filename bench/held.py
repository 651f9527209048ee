"""`held_pulls`: the cost of 10,000 parked long-polling pulls, then of waking them all.

10 topics of 100 queues, 10 pulls per queue (SUSPEND, suspend_timeout_ms 60000) over 100
connections, a queue's pulls on different connections. Every queue first gets one message (pulled
at offset 1, the pulls are at the queue's end): the first message of a new queue costs the broker
a first write into a new consume-queue file, which is measured here on its own
(`held_pulls.new_queue_first_send`) rather than inside the wake-up. Once all pulls are written, wait
at least 2 s and until the broker's CPU is idle (bounded), then measure the broker's CPU over 5 s
and its RSS (the same CPU measurement is made before the pulls, as a baseline). Then send one
message to every queue (one SEND_MESSAGE per queue: a batch holds one queue's messages, 64 in
flight) and time until every held pull has answered."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

from bench.common import Options, connected, pull_header, running_broker, send_to_each_queue, settle
from bench.report import BenchResult
from client.api import PullResult
from protocol.model import PullStatus

CPU_TARGET_FRACTION = 0.01
RSS_TARGET_MB = 100.0
SUSPEND_TIMEOUT_MS = 60_000
RPC_TIMEOUT_MS = 70_000


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldParams:
    topics: int
    queues_per_topic: int
    pulls_per_queue: int
    connections: int
    measure_s: float
    settle_min_s: float
    settle_max_s: float
    send_time_limit_s: float

    @property
    def queues(self) -> int:
        return self.topics * self.queues_per_topic

    @property
    def pulls(self) -> int:
        return self.queues * self.pulls_per_queue


FULL = HeldParams(topics=10, queues_per_topic=100, pulls_per_queue=10, connections=100, measure_s=5.0,
                  settle_min_s=2.0, settle_max_s=15.0, send_time_limit_s=60.0)
QUICK = HeldParams(topics=10, queues_per_topic=10, pulls_per_queue=10, connections=10, measure_s=2.0,
                   settle_min_s=1.0, settle_max_s=5.0, send_time_limit_s=15.0)


async def held_pulls(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "queues": params.queues, "pulls": params.pulls,
                     "suspend_timeout_ms": SUSPEND_TIMEOUT_MS}
    topics = [f"bench_held_{t}" for t in range(params.topics)]
    answered_at: list[float] = []
    async with running_broker(opts) as broker, connected(broker.address, params.connections) as pullers, \
            connected(broker.address, 4) as senders:
        address = broker.address
        for topic in topics:
            await senders[0].create_topic(address, topic, queue_nums=params.queues_per_topic)
        first = await send_to_each_queue(senders, address, topics, params.queues_per_topic, params.send_time_limit_s)
        await settle(broker.usage, params.settle_min_s, params.settle_max_s)
        idle = broker.usage()
        await asyncio.sleep(params.measure_s)
        idle_cores = broker.usage().cores_since(idle)
        rss_before_mb = broker.usage().rss_bytes / (1 << 20)

        async def hold(index: int) -> PullResult:
            queue = index % params.queues
            topic, queue_id = topics[queue // params.queues_per_topic], queue % params.queues_per_topic
            header = pull_header(topic, queue_id, 1, max_msg_nums=32, suspend_timeout_ms=SUSPEND_TIMEOUT_MS)
            api = pullers[index * params.connections // params.pulls]
            pulled = await api.pull_message(address, header, timeout_ms=RPC_TIMEOUT_MS)
            answered_at.append(time.perf_counter())
            return pulled

        write_started = time.perf_counter()
        tasks = [asyncio.create_task(hold(i)) for i in range(params.pulls)]
        await asyncio.sleep(0)   # every task has written its request by now
        write_s = time.perf_counter() - write_started
        settle_s = await settle(broker.usage, params.settle_min_s, params.settle_max_s)
        before = broker.usage()
        await asyncio.sleep(params.measure_s)
        after = broker.usage()
        early = len(answered_at)

        wake_started = time.perf_counter()
        wake = await send_to_each_queue(senders, address, topics, params.queues_per_topic, params.send_time_limit_s)
        sends_done = time.perf_counter()
        done, pending = await asyncio.wait(tasks, timeout=params.send_time_limit_s)
        for task in pending:
            task.cancel()
        found = sum(1 for t in done if not t.cancelled() and t.exception() is None
                    and t.result().status is PullStatus.FOUND and len(t.result().messages) == 1)
        errors = [repr(t.exception()) for t in done if not t.cancelled() and t.exception() is not None]
        rss_after_wake_mb = broker.usage().rss_bytes / (1 << 20)

    held_rss_mb = after.rss_bytes / (1 << 20)
    last_answer = max(answered_at) if answered_at else float("nan")
    result.add("held_pulls.idle_cpu", round(after.cores_since(before), 4), "cores", ("≤", CPU_TARGET_FRACTION))
    result.add("held_pulls.idle_cpu_without_pulls", round(idle_cores, 4), "cores")
    result.add("held_pulls.rss", round(held_rss_mb, 1), "MB", ("≤", RSS_TARGET_MB))
    result.add("held_pulls.wake_all", round((last_answer - wake_started) * 1000, 1), "ms")
    result.add("held_pulls.answered", found, "pulls", ("≥", params.pulls))
    result.add("held_pulls.new_queue_first_send", round(first.elapsed_s / params.queues * 1000, 2), "ms/queue")
    result.details = {
        "rss_before_pulls_mb": round(rss_before_mb, 1),
        "rss_held_mb": round(held_rss_mb, 1), "rss_after_wake_mb": round(rss_after_wake_mb, 1),
        "rss_per_held_pull_kb": round((held_rss_mb - rss_before_mb) * 1024 / params.pulls, 2),
        "first_send_to_every_queue_s": round(first.elapsed_s, 3),
        "write_all_pulls_s": round(write_s, 3), "settle_s": round(settle_s, 3),
        "answered_before_wake": early, "wake_sends_s": round(sends_done - wake_started, 3),
        "wake_send_rate_per_s": round(wake.rate), "found": found, "pull_errors": len(errors),
        "pull_error_samples": errors[:5], "not_answered": len(pending)}
    if early:
        result.notes.append(f"{early} pulls were answered before the wake-up (not held)")
    if found != params.pulls:
        result.ok = False
        result.error = (f"{found} of {params.pulls} held pulls got their message "
                        f"({len(pending)} unanswered, {len(errors)} errors)")
