"""`client_produce`: throughput of the public `Producer`, for SYNC_FLUSH (the default) and ASYNC_FLUSH.

- `client_produce.send.128B.<flush>`: one message per `Producer.send`, `one_workers` tasks at once;
- `client_produce.send_batch.128B.<flush>`: `Producer.send_batch` of 32, `batch_workers` tasks.

Each run builds fresh `Message` objects per call (the producer stamps a UNIQ_KEY into each, so a
message cannot be sent twice), goes through route lookup, queue round-robin and the producer's one
connection, exactly as an application would. Every run has its own 8-queue topic, and afterwards
the broker's max queue offsets (GET_MAX_OFFSET per queue) must add up to the messages acknowledged."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.broker_proc import BrokerProcess
from bench.common import (
    BATCH_SIZE,
    PRODUCER_GROUP,
    CpuMeter,
    LoadStats,
    Options,
    connected,
    drive,
    note_neighbours,
    running_broker,
)
from bench.report import BenchResult, Op, percentile
from client import Message, Producer

FLUSH_TYPES = ("SYNC_FLUSH", "ASYNC_FLUSH")
BATCH_TARGET_MSG_S = 100_000.0   # 128 B, send_batch of 32, SYNC_FLUSH
SEND_TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceParams:
    one_messages: int
    one_workers: int
    batch_messages: int
    batch_workers: int
    time_limit_s: float
    queues: int
    body_bytes: int


FULL = ProduceParams(one_messages=100_000, one_workers=64, batch_messages=600_000, batch_workers=32,
                     time_limit_s=10.0, queues=8, body_bytes=128)
QUICK = ProduceParams(one_messages=10_000, one_workers=64, batch_messages=64_000, batch_workers=32,
                      time_limit_s=2.0, queues=8, body_bytes=128)


def batch_of(topic: str, body: bytes, size: int = BATCH_SIZE) -> list[Message]:
    """`size` fresh messages with a tag and a key (the producer adds the UNIQ_KEY)."""
    return [Message(topic=topic, body=body, tags="TagA", keys=f"k{i}") for i in range(size)]


def batch_sender(producer: Producer, topic: str, body: bytes,
                 latencies_s: list[float] | None = None) -> Callable[[int], Awaitable[int]]:
    """A `drive` call: one `send_batch` of BATCH_SIZE fresh messages; returns BATCH_SIZE."""
    async def call(index: int) -> int:
        messages = batch_of(topic, body)
        started = time.perf_counter()
        await producer.send_batch(messages)
        if latencies_s is not None:
            latencies_s.append(time.perf_counter() - started)
        return BATCH_SIZE
    return call


def one_sender(producer: Producer, topic: str, body: bytes,
               latencies_s: list[float] | None = None) -> Callable[[int], Awaitable[int]]:
    """A `drive` call: one `send` of a fresh message; returns 1."""
    async def call(index: int) -> int:
        message = Message(topic=topic, body=body, tags="TagA", keys=f"k{index}")
        started = time.perf_counter()
        await producer.send(message)
        if latencies_s is not None:
            latencies_s.append(time.perf_counter() - started)
        return 1
    return call


async def max_offsets(address: str, topic: str, queues: int) -> list[int]:
    """GET_MAX_OFFSET of every queue of `topic`, on a connection of its own."""
    async with connected(address, 1) as clients:
        return [await clients[0].get_max_offset(address, topic, q) for q in range(queues)]


async def create_topic(address: str, topic: str, queues: int) -> None:
    async with connected(address, 1) as clients:
        await clients[0].create_topic(address, topic, queue_nums=queues)


def latency_summary(latencies_s: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_s)
    return {f"p{int(q * 100)}_ms": round(percentile(ordered, q) * 1000, 3) for q in (0.5, 0.9, 0.99)}


def stats_json(stats: LoadStats) -> dict[str, Any]:
    return {"messages": stats.messages, "requests": stats.requests, "errors": stats.errors,
            "elapsed_s": round(stats.elapsed_s, 3), "stopped_by_time_limit": stats.timed_out,
            "error_samples": stats.error_samples}


async def _run(result: BenchResult, broker: BrokerProcess, kind: str, flush: str, params: ProduceParams) -> None:
    """One measured run of `kind` ("send" or "send_batch") on a fresh topic, then the offset check."""
    topic = f"bench_cp_{kind}"
    body = bytes(params.body_bytes)
    await create_topic(broker.address, topic, params.queues)
    latencies: list[float] = []
    batched = kind == "send_batch"
    async with Producer(PRODUCER_GROUP, broker.address, send_msg_timeout_ms=SEND_TIMEOUT_MS) as producer:
        make = batch_sender if batched else one_sender
        call = make(producer, topic, body, latencies)
        warm = await drive(range(params.queues * 4), call, workers=params.queues, time_limit_s=10)
        if warm.errors:
            raise RuntimeError(f"warm-up sends failed: {warm.error_samples}")
        latencies.clear()
        count = params.batch_messages // BATCH_SIZE if batched else params.one_messages
        workers = params.batch_workers if batched else params.one_workers
        meter = CpuMeter(broker)
        meter.start()
        stats = await drive(range(count), call, workers=workers, time_limit_s=params.time_limit_s)
        cpu = meter.stop()
    label = f"client_produce.{kind}.{params.body_bytes}B.{flush}"
    target: tuple[Op, float] | None = ("≥", BATCH_TARGET_MSG_S) if batched and flush == "SYNC_FLUSH" else None
    result.add(label, round(stats.rate), "msg/s", target)
    result.add(f"{label}.client_cpu", cpu["client_cores"], "cores")
    result.add(f"{label}.broker_cpu", cpu["broker_cores"], "cores")
    acknowledged = warm.messages + stats.messages
    stored = sum(await max_offsets(broker.address, topic, params.queues))
    result.add(f"{label}.offset_mismatch", abs(stored - acknowledged), "msgs", ("≤", 0))
    result.details[label] = {**stats_json(stats), **cpu, **latency_summary(latencies), "workers": workers,
                             "acknowledged_with_warmup": acknowledged, "broker_max_offsets_sum": stored}
    note_neighbours(result, label, cpu)
    if stats.errors:
        result.ok = False
        result.error = f"{label}: {stats.errors} failed sends, e.g. {stats.error_samples[:1]}"
    if stored != acknowledged:
        result.ok = False
        result.error = f"{label}: broker holds {stored} messages, {acknowledged} were acknowledged"
    if stats.timed_out:
        result.notes.append(f"{label}: stopped by the time limit after {stats.messages} messages")


async def client_produce(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "batch_size": BATCH_SIZE, "producer_connections": 1}
    result.notes.append("one Producer (one connection) per run; Message objects built inside the measured loop")
    for flush in FLUSH_TYPES:
        async with running_broker(opts, {"store.flush_disk_type": flush}) as broker:
            for kind in ("send", "send_batch"):
                await _run(result, broker, kind, flush, params)
