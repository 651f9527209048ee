"""10,000 idle blocked readers: the server's CPU while they wait, its RSS, and the time to wake all.

The same shape on both sides, "consumers each waiting on a queue": 1,000 queues (rocketq: 10
topics of 100 queues; Redis: 1,000 streams), 10 blocked readers on each, every reader at the
queue's end after one message. rocketq: held pulls (`ClientAPI.pull_message`, SUSPEND,
suspend_timeout_ms 60000) over 100 connections (as `bench.held`); Redis: `XREAD COUNT 32 BLOCK 0
STREAMS s_i <id>` (XREAD, not XREADGROUP: 10 readers of one stream all get its message, as 10
held pulls of one queue do), one connection per blocked reader (redis-py cannot multiplex), i.e.
10,000 connections opened before the reads start, 500 at a time.

Measured on a fresh in-memory server (rocketq ASYNC_FLUSH, Redis without persistence): the
server's CPU over `measure_s` without readers, then with all readers parked (after at least
`settle_min_s` and a quiet second), its RSS both times, then one message to every queue
(64 sends in flight) and the time from the first send until every reader has its message. Check:
every reader got exactly the one message of its own queue."""

from __future__ import annotations

import asyncio
import gc
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psutil
import redis.asyncio as aioredis

from bench.broker_proc import BrokerProcess, Usage, process_usage
from bench.common import Clients, connected, drive, pull_header, send_to_each_queue, settle
from bench.peers.consume import entries_of
from bench.peers.results import Delivery, Side
from bench.peers.servers import Measured, RedisServer
from protocol.model import PullStatus

HOLD_MS = 60_000
FIELD = b"body"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockedParams:
    queues: int
    readers_per_queue: int
    rocketq_connections: int
    measure_s: float
    settle_min_s: float
    settle_max_s: float
    wake_time_limit_s: float

    @property
    def readers(self) -> int:
        return self.queues * self.readers_per_queue


FULL = BlockedParams(queues=1_000, readers_per_queue=10, rocketq_connections=100, measure_s=5.0,
                     settle_min_s=2.0, settle_max_s=15.0, wake_time_limit_s=60.0)
QUICK = BlockedParams(queues=100, readers_per_queue=10, rocketq_connections=10, measure_s=2.0,
                      settle_min_s=1.0, settle_max_s=5.0, wake_time_limit_s=15.0)
QUEUES_PER_TOPIC = 100


@dataclass(slots=True)
class BlockedOutcome:
    """The four rows' sides: wake-all time (ms), idle CPU (cores), RSS (MB) with readers."""

    wake_all: Side
    idle_cpu: Side
    rss: Side


def _own_calls() -> tuple[int, int]:
    """This process's read- and write-type system calls so far."""
    usage = process_usage(psutil.Process())
    return usage.read_calls, usage.write_calls


async def _idle(server: Measured, params: BlockedParams) -> tuple[float, Usage]:
    before = server.usage()
    await asyncio.sleep(params.measure_s)
    after = server.usage()
    return after.cores_since(before), after


async def _measure(server: Measured, params: BlockedParams, tasks: list[asyncio.Task[bool]],
                   answered_at: list[float], wake: Callable[[], Awaitable[Any]],
                   baseline: tuple[float, Usage], setup: dict[str, Any]) -> BlockedOutcome:
    """Settle, idle CPU and RSS with the readers parked, wake them all; builds the three sides."""
    settle_s = await settle(server.usage, params.settle_min_s, params.settle_max_s)
    idle_cores, held = await _idle(server, params)
    early = len(answered_at)
    # The readers' tasks and connections (either system's) out of the collector's sight while they
    # are woken: its rounds over them stalled this process 5-80 ms in the middle of a wake.
    gc.collect()
    gc.freeze()
    try:
        # The wait for every reader is set up before the clock starts: registering 10,000 done
        # callbacks is the benchmark's bookkeeping (10-15 ms of this process's CPU), not either
        # system's (until November 25 it ran inside the measured wake, for both systems).
        everyone = asyncio.ensure_future(asyncio.wait(tasks, timeout=params.wake_time_limit_s))
        await asyncio.sleep(0)
        server_before, client_before, client_calls_before = server.usage(), time.process_time(), _own_calls()
        wake_started = time.perf_counter()
        await wake()
        sends_s = time.perf_counter() - wake_started
        done, pending = await everyone
        server_after, client_after, client_calls_after = server.usage(), time.process_time(), _own_calls()
    finally:
        gc.unfreeze()
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    got = [i for i, t in enumerate(tasks) if t in done and not t.cancelled() and t.exception() is None and t.result()]
    errors = [repr(t.exception()) for t in done if not t.cancelled() and t.exception() is not None]
    wake_ms = (max(answered_at) - wake_started) * 1000 if answered_at and not pending else float("nan")
    base_cores, base = baseline
    details = {**setup, "settle_s": round(settle_s, 3), "answered_before_wake": early,
               "wake_sends_s": round(sends_s, 3),
               # CPU over the wake (from the first send until every reader was answered, or the limit)
               "wake_server_cpu_ms": round((server_after.cpu_s - server_before.cpu_s) * 1000, 1),
               "wake_server_system_cpu_ms": round((server_after.system_s - server_before.system_s) * 1000, 1),
               "wake_client_cpu_ms": round((client_after - client_before) * 1000, 1),
               # read- and write-type system calls over the wake (socket reads and writes among them)
               "wake_server_read_calls": server_after.read_calls - server_before.read_calls,
               "wake_server_write_calls": server_after.write_calls - server_before.write_calls,
               "wake_client_read_calls": client_calls_after[0] - client_calls_before[0],
               "wake_client_write_calls": client_calls_after[1] - client_calls_before[1],
               "not_answered": len(pending), "errors": len(errors), "error_samples": errors[:3],
               "idle_cores_without_readers": round(base_cores, 4), "idle_cores_with_readers": round(idle_cores, 4),
               "rss_without_readers_mb": round(base.rss_bytes / (1 << 20), 1),
               "rss_with_readers_mb": round(held.rss_bytes / (1 << 20), 1),
               "rss_per_reader_kb": round((held.rss_bytes - base.rss_bytes) / 1024 / params.readers, 2)}
    error = None
    if early or pending or errors:
        error = f"{early} answered early, {len(pending)} unanswered, {len(errors)} errors"
    return BlockedOutcome(
        wake_all=Side(value=round(wake_ms, 1), delivery=Delivery.of(range(len(tasks)), got), details=details,
                      error=error),
        idle_cpu=Side(value=round(idle_cores, 4), error=error),
        rss=Side(value=round(held.rss_bytes / (1 << 20), 1), error=error))


async def _send_rocketq(senders: Clients, address: str, topics: list[str], params: BlockedParams) -> None:
    await send_to_each_queue(senders, address, topics, QUEUES_PER_TOPIC, params.wake_time_limit_s)


async def rocketq_blocked(broker: BrokerProcess, params: BlockedParams) -> BlockedOutcome:
    address = broker.address
    topics = [f"peers_held_{t}" for t in range(max(1, params.queues // QUEUES_PER_TOPIC))]
    answered_at: list[float] = []
    async with connected(address, params.rocketq_connections) as pullers, connected(address, 4) as senders:
        for topic in topics:
            await senders[0].create_topic(address, topic, queue_nums=QUEUES_PER_TOPIC)
        await _send_rocketq(senders, address, topics, params)
        await settle(broker.usage, params.settle_min_s, params.settle_max_s)
        baseline = await _idle(broker, params)

        async def hold(index: int) -> bool:
            queue = index % params.queues
            header = pull_header(topics[queue // QUEUES_PER_TOPIC], queue % QUEUES_PER_TOPIC, 1,
                                 suspend_timeout_ms=HOLD_MS)
            pulled = await pullers[index * params.rocketq_connections // params.readers].pull_message(
                address, header, timeout_ms=HOLD_MS + 10_000)
            answered_at.append(time.perf_counter())
            return (pulled.status is PullStatus.FOUND and len(pulled.messages) == 1
                    and pulled.messages[0].queue_offset == 1)

        started = time.perf_counter()
        tasks = [asyncio.create_task(hold(i)) for i in range(params.readers)]
        await asyncio.sleep(0)
        setup = {"park_all_s": round(time.perf_counter() - started, 3), "connections": params.rocketq_connections}
        return await _measure(broker, params, tasks, answered_at,
                              lambda: _send_rocketq(senders, address, topics, params), baseline, setup)


async def _open_connections(pool: aioredis.ConnectionPool, count: int, chunk: int = 500) -> float:
    """Open `count` connections in the pool (then idle in it); returns the seconds it took."""
    started = time.perf_counter()
    opened: list[Any] = []

    def acquire() -> Awaitable[Any]:
        # redis-py 5 requires a command name, later versions deprecate passing one
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return pool.get_connection("XREAD")  # type: ignore[no-untyped-call]

    for first in range(0, count, chunk):
        opened += await asyncio.gather(*(acquire() for _ in range(min(chunk, count - first))))
    for connection in opened:
        await pool.release(connection)
    return time.perf_counter() - started


async def _blocked_clients(client: aioredis.Redis, wanted: int, timeout_s: float) -> int:
    """INFO clients' blocked_clients once it reaches `wanted` (polled), or its value at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        blocked = int((await client.info("clients"))["blocked_clients"])
        if blocked >= wanted or time.monotonic() >= deadline:
            return blocked
        await asyncio.sleep(0.05)


async def redis_blocked(server: RedisServer, params: BlockedParams) -> BlockedOutcome:
    streams = [f"peers_held_{q}" for q in range(params.queues)]
    admin = server.client(max_connections=66)
    pool = aioredis.ConnectionPool(host="127.0.0.1", port=server.port, max_connections=params.readers + 10,
                                   socket_timeout=None)
    readers = aioredis.Redis(connection_pool=pool)
    answered_at: list[float] = []
    tasks: list[asyncio.Task[bool]] = []
    try:
        first_ids = [await admin.xadd(s, {FIELD: b"first"}) for s in streams]
        await settle(server.usage, params.settle_min_s, params.settle_max_s)
        baseline = await _idle(server, params)
        connect_s = await _open_connections(pool, params.readers)

        async def hold(index: int) -> bool:
            queue = index % params.queues
            reply = await readers.xread({streams[queue]: first_ids[queue]}, count=32, block=0)
            answered_at.append(time.perf_counter())
            entries = entries_of(reply)
            return len(entries) == 1 and entries[0][1].get(FIELD) == b"held"

        started = time.perf_counter()
        tasks = [asyncio.create_task(hold(i)) for i in range(params.readers)]
        blocked = await _blocked_clients(admin, params.readers, 30)
        setup = {"connect_all_s": round(connect_s, 3), "park_all_s": round(time.perf_counter() - started, 3),
                 "connections": params.readers, "blocked_clients_reported": blocked}

        async def wake() -> None:
            async def send(index: int) -> int:
                await admin.xadd(streams[index], {FIELD: b"held"})
                return 1
            stats = await drive(range(params.queues), send, workers=64, time_limit_s=params.wake_time_limit_s)
            if stats.errors or stats.messages != params.queues:
                raise RuntimeError(f"sent {stats.messages} of {params.queues}: {stats.error_samples}")

        return await _measure(server, params, tasks, answered_at, wake, baseline, setup)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.disconnect()
        await readers.aclose()
        await admin.aclose()
