"""`pull`: throughput of pulls of 32 from a 1,000,000-message backlog of 128 B messages, one pull
loop per queue, all queues at once. The backlog is filled with batched sends on an ASYNC_FLUSH
broker first (the fill rate is reported too, but it is not the measured quantity)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

from bench.common import (
    BATCH_SIZE,
    Clients,
    CpuMeter,
    batch_header,
    connected,
    drive,
    pull_header,
    running_broker,
    synthetic_batches,
)
from bench.report import BenchResult
from protocol.model import PullStatus

PULL_TARGET_MSG_S = 250_000.0
TOPIC = "bench_pull"


@dataclass(frozen=True, slots=True, kw_only=True)
class PullParams:
    messages: int
    queues: int
    max_msg_nums: int
    connections: int
    fill_time_limit_s: float
    pull_time_limit_s: float


FULL = PullParams(messages=1_000_000, queues=8, max_msg_nums=32, connections=2, fill_time_limit_s=90,
                  pull_time_limit_s=60)
QUICK = PullParams(messages=100_000, queues=8, max_msg_nums=32, connections=2, fill_time_limit_s=15,
                   pull_time_limit_s=10)


@dataclass(slots=True)
class QueueProgress:
    queue_id: int
    expected: int
    queue_offset: int = 0
    received: int = 0
    pulls: int = 0
    empty_pulls: int = 0
    gaps: int = 0


async def _fill(clients: Clients, address: str, params: PullParams, sent_per_queue: list[int],
                result: BenchResult) -> None:
    bodies = synthetic_batches(TOPIC, 128, BATCH_SIZE)
    headers = [batch_header(TOPIC, q) for q in range(params.queues)]

    async def call(index: int) -> int:
        queue_id = index % params.queues
        await clients[index].send_batch(address, headers[queue_id], bodies[index % len(bodies)],
                                        timeout_ms=10_000)
        sent_per_queue[queue_id] += BATCH_SIZE
        return BATCH_SIZE

    stats = await drive(range(params.messages // BATCH_SIZE), call, workers=32,
                        time_limit_s=params.fill_time_limit_s)
    result.add("pull.fill_send_batch.128B.ASYNC_FLUSH", round(stats.rate), "msg/s")
    result.details["fill"] = {"messages": stats.messages, "elapsed_s": round(stats.elapsed_s, 3),
                              "errors": stats.errors, "error_samples": stats.error_samples,
                              "flush": "ASYNC_FLUSH"}
    if stats.errors or stats.timed_out:
        result.notes.append(f"fill stopped early: {stats.messages} messages, {stats.errors} errors")


async def _pull_queue(clients: Clients, address: str, progress: QueueProgress, max_msg_nums: int,
                      deadline: float) -> None:
    """Pull from offset 0 until `expected` messages arrived or the deadline passes. A pull at the
    end (the reput is behind) waits up to 1 s as a held pull rather than spinning."""
    api = clients[progress.queue_id]
    while progress.received < progress.expected and time.perf_counter() < deadline:
        header = pull_header(TOPIC, progress.queue_id, progress.queue_offset, max_msg_nums=max_msg_nums,
                             suspend_timeout_ms=1_000)
        pulled = await api.pull_message(address, header, timeout_ms=10_000)
        progress.pulls += 1
        if pulled.status is PullStatus.FOUND and pulled.messages:
            if pulled.messages[0].queue_offset != progress.queue_offset:
                progress.gaps += 1
            progress.received += len(pulled.messages)
        else:
            progress.empty_pulls += 1
        progress.queue_offset = pulled.next_begin_offset


async def pull(result: BenchResult, quick: bool) -> None:
    params = QUICK if quick else FULL
    result.params = asdict(params)
    result.notes.append("backlog filled with SEND_BATCH_MESSAGE of 32 on an ASYNC_FLUSH broker")
    async with running_broker({"store.flush_disk_type": "ASYNC_FLUSH"}) as broker, \
            connected(broker.address, params.connections) as clients:
        address = broker.address
        await clients[0].create_topic(address, TOPIC, queue_nums=params.queues)
        sent_per_queue = [0] * params.queues
        await _fill(clients, address, params, sent_per_queue, result)
        await asyncio.sleep(1.0)   # let the fill's reput and flush settle before measuring
        progress = [QueueProgress(q, sent_per_queue[q]) for q in range(params.queues)]
        meter = CpuMeter(broker)
        meter.start()
        started = time.perf_counter()
        deadline = started + params.pull_time_limit_s
        async with asyncio.timeout(params.pull_time_limit_s + 30):
            await asyncio.gather(*(_pull_queue(clients, address, p, params.max_msg_nums, deadline)
                                   for p in progress))
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
    received, sent = sum(p.received for p in progress), sum(sent_per_queue)
    rate = received / elapsed if elapsed > 0 else float("nan")
    result.add("pull.128B.x32", round(rate), "msg/s", ("≥", PULL_TARGET_MSG_S))
    result.add("pull.broker_cpu", cpu["broker_cores"], "cores")
    result.add("pull.client_cpu", cpu["client_cores"], "cores")
    result.add("pull.count_mismatch", abs(received - sent), "msgs", ("≤", 0))
    result.details["pull"] = {
        "sent": sent, "received": received, "elapsed_s": round(elapsed, 3), **cpu,
        "pulls": sum(p.pulls for p in progress), "empty_pulls": sum(p.empty_pulls for p in progress),
        "per_queue": [asdict(p) for p in progress]}
    gaps = sum(p.gaps for p in progress)
    if received != sent or gaps:
        result.ok = False
        result.error = f"received {received} of {sent} sent messages ({gaps} pulls started at a wrong offset)"
