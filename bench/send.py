"""`send_batch` (SEND_BATCH_MESSAGE of 32) and `send_one` (SEND_MESSAGE) throughput, for SYNC_FLUSH
and ASYNC_FLUSH, with many requests in flight over a few connections and queues."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.broker_proc import BrokerProcess
from bench.common import (
    BATCH_SIZE,
    PRODUCER_GROUP,
    Clients,
    CpuMeter,
    LoadStats,
    Options,
    batch_header,
    broker_with_clients,
    drive,
    note_neighbours,
    synthetic_batches,
)
from bench.report import BenchResult, Op, percentile
from client.api import ClientAPI
from protocol.headers import SendMessageRequestHeader

FLUSH_TYPES = ("SYNC_FLUSH", "ASYNC_FLUSH")
BATCH_TARGET_MSG_S = 100_000.0   # 128 B, SYNC_FLUSH


@dataclass(frozen=True, slots=True, kw_only=True)
class SendParams:
    messages: int
    time_limit_s: float
    workers: int
    connections: int
    queues: int
    body_sizes: tuple[int, ...]


BATCH_FULL = SendParams(messages=300_000, time_limit_s=10.0, workers=32, connections=2, queues=8,
                        body_sizes=(128, 1024))
BATCH_QUICK = SendParams(messages=40_000, time_limit_s=2.0, workers=32, connections=2, queues=8,
                         body_sizes=(128, 1024))
ONE_FULL = SendParams(messages=100_000, time_limit_s=8.0, workers=64, connections=2, queues=8,
                      body_sizes=(128,))
ONE_QUICK = SendParams(messages=10_000, time_limit_s=2.0, workers=64, connections=2, queues=8,
                       body_sizes=(128,))


def _latency_summary(latencies_s: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_s)
    return {f"p{int(q * 100)}_ms": round(percentile(ordered, q) * 1000, 3) for q in (0.5, 0.9, 0.99)}


async def _batch_run(broker: BrokerProcess, clients: Clients, topic: str, body_bytes: int,
                     params: SendParams) -> tuple[LoadStats, dict[str, float], list[float]]:
    bodies = synthetic_batches(topic, body_bytes, BATCH_SIZE)
    headers = [batch_header(topic, q) for q in range(params.queues)]
    latencies: list[float] = []
    address = broker.address

    async def call(index: int) -> int:
        started = time.perf_counter()
        await clients[index].send_batch(address, headers[index % len(headers)], bodies[index % len(bodies)],
                                        timeout_ms=10_000)
        latencies.append(time.perf_counter() - started)
        return BATCH_SIZE

    await clients[0].create_topic(address, topic, queue_nums=params.queues)
    await _warm_up(call, params)
    latencies.clear()
    meter = CpuMeter(broker)
    meter.start()
    stats = await drive(range(params.messages // BATCH_SIZE), call, workers=params.workers,
                        time_limit_s=params.time_limit_s)
    return stats, meter.stop(), latencies


async def send_batch(result: BenchResult, opts: Options) -> None:
    params = BATCH_QUICK if opts.quick else BATCH_FULL
    result.params = {**asdict(params), "batch_size": BATCH_SIZE}
    for flush in FLUSH_TYPES:
        settings = {"store.flush_disk_type": flush}
        async with broker_with_clients(opts, params.connections, settings) as (broker, clients):
            for body_bytes in params.body_sizes:
                label = f"{_size(body_bytes)}.{flush}"
                stats, cpu, latencies = await _batch_run(broker, clients, f"bench_batch_{body_bytes}",
                                                         body_bytes, params)
                target: tuple[Op, float] | None = (
                    ("≥", BATCH_TARGET_MSG_S) if body_bytes == 128 and flush == "SYNC_FLUSH" else None)
                result.add(f"send_batch.{label}", round(stats.rate), "msg/s", target)
                result.add(f"send_batch.{label}.bandwidth",
                           round(stats.rate * body_bytes / 1e6, 1), "MB/s")
                result.add(f"send_batch.{label}.broker_cpu", cpu["broker_cores"], "cores")
                result.details[label] = {**_stats_json(stats), **cpu, **_latency_summary(latencies)}
                note_neighbours(result, f"send_batch.{label}", cpu)
                _check(result, label, stats)


async def send_one(result: BenchResult, opts: Options) -> None:
    params = ONE_QUICK if opts.quick else ONE_FULL
    result.params = asdict(params)
    body = bytes(params.body_sizes[0])
    topic = "bench_one"
    for flush in FLUSH_TYPES:
        settings = {"store.flush_disk_type": flush}
        async with broker_with_clients(opts, params.connections, settings) as (broker, clients):
            address = broker.address
            latencies: list[float] = []

            async def call(index: int, clients: Clients = clients, address: str = address,
                           latencies: list[float] = latencies) -> int:
                api: ClientAPI = clients[index]
                header = SendMessageRequestHeader(
                    producer_group=PRODUCER_GROUP, topic=topic, queue_id=index % params.queues,
                    born_timestamp=0, properties={"TAGS": "TagA", "UNIQ_KEY": f"BENCHONE{index:016X}"})
                started = time.perf_counter()
                await api.send_message(address, header, body, timeout_ms=10_000)
                latencies.append(time.perf_counter() - started)
                return 1

            await clients[0].create_topic(address, topic, queue_nums=params.queues)
            await _warm_up(call, params)
            latencies.clear()
            meter = CpuMeter(broker)
            meter.start()
            stats = await drive(range(params.messages), call, workers=params.workers,
                                time_limit_s=params.time_limit_s)
            cpu = meter.stop()
            label = f"{_size(len(body))}.{flush}"
            result.add(f"send_one.{label}", round(stats.rate), "msg/s")
            result.add(f"send_one.{label}.broker_cpu", cpu["broker_cores"], "cores")
            result.details[label] = {**_stats_json(stats), **cpu, **_latency_summary(latencies)}
            note_neighbours(result, f"send_one.{label}", cpu)
            _check(result, label, stats)


async def _warm_up(call: Callable[[int], Awaitable[int]], params: SendParams) -> None:
    """A few requests on every queue before measuring; raises RuntimeError if any fails."""
    stats = await drive(range(params.queues * 4), call, workers=params.queues, time_limit_s=10)
    if stats.errors:
        raise RuntimeError(f"warm-up sends failed: {stats.error_samples}")


def _size(body_bytes: int) -> str:
    return f"{body_bytes // 1024}KiB" if body_bytes >= 1024 else f"{body_bytes}B"


def _stats_json(stats: LoadStats) -> dict[str, Any]:
    return {"messages": stats.messages, "requests": stats.requests, "errors": stats.errors,
            "elapsed_s": round(stats.elapsed_s, 3), "stopped_by_time_limit": stats.timed_out,
            "error_samples": stats.error_samples}


def _check(result: BenchResult, label: str, stats: LoadStats) -> None:
    if stats.errors:
        result.ok = False
        result.error = f"{label}: {stats.errors} failed requests, e.g. {stats.error_samples[:1]}"
    if stats.timed_out:
        result.notes.append(f"{label}: stopped by the time limit after {stats.messages} messages")
