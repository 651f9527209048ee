"""Send throughput through each system's Python client, `workers` sends in flight.

- one at a time: rocketq `Producer.send` of one `Message` (one producer, one connection, requests
  multiplexed on it); Redis `XADD stream * body <bytes>` on a redis.asyncio pool of `workers`
  connections (redis-py cannot multiplex, so a pool is its way to have `workers` in flight);
- batched: rocketq `Producer.send_batch` of 32 (one SEND_BATCH_MESSAGE); Redis a
  `pipeline(transaction=False)` of 32 XADD (one write, 32 replies).

Each run gets a fresh topic (8 queues) / stream and a warm-up of 2 * `workers` calls (connections
opened, routes known) that is not measured. Delivery: every acknowledged message is stored once.
rocketq: the (queue_id, queue_offset) of every acknowledged message against every offset below
the broker's max offsets (GET_MAX_OFFSET); Redis: the returned entry ids against XLEN."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from bench.broker_proc import BrokerProcess
from bench.client_produce import create_topic, max_offsets
from bench.common import BATCH_SIZE, PRODUCER_GROUP, LoadStats, drive
from bench.peers.results import Delivery, Side
from bench.peers.servers import RedisServer, ServerMeter, cpu_us_per_call
from bench.report import percentile
from client import Message, Producer

SEND_TIMEOUT_MS = 10_000
QUEUES = 8
FIELD = b"body"


@dataclass(frozen=True, slots=True, kw_only=True)
class SendParams:
    messages: int          # per run, measured part (the time limit may stop it earlier)
    workers: int
    time_limit_s: float


ONE_FULL = SendParams(messages=100_000, workers=64, time_limit_s=8.0)
ONE_QUICK = SendParams(messages=10_000, workers=64, time_limit_s=2.0)
BATCH_FULL = SendParams(messages=300_000, workers=32, time_limit_s=8.0)
BATCH_QUICK = SendParams(messages=40_000, workers=32, time_limit_s=2.0)
# The sequential shapes: one caller awaiting each call before the next (no concurrency to hide
# a round trip behind), as a user with one producer loop sends.
ONE_SEQ_FULL = SendParams(messages=60_000, workers=1, time_limit_s=6.0)
ONE_SEQ_QUICK = SendParams(messages=10_000, workers=1, time_limit_s=2.0)
BATCH_SEQ_FULL = SendParams(messages=300_000, workers=1, time_limit_s=6.0)
BATCH_SEQ_QUICK = SendParams(messages=40_000, workers=1, time_limit_s=2.0)


def _side(stats: LoadStats, cpu: dict[str, float], latencies_s: list[float], delivery: Delivery) -> Side:
    ordered = sorted(latencies_s)
    details = {"messages": stats.messages, "calls": stats.requests, "errors": stats.errors,
               "elapsed_s": round(stats.elapsed_s, 3), "stopped_by_time_limit": stats.timed_out,
               "error_samples": stats.error_samples, **cpu,
               **{f"call_p{int(q * 100)}_ms": round(percentile(ordered, q) * 1000, 3) for q in (0.5, 0.99)}}
    calls_s = stats.requests / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
    details.update(cpu_us_per_call(cpu, calls_s))
    error = f"{stats.errors} failed calls, e.g. {stats.error_samples[:1]}" if stats.errors else None
    return Side(value=round(stats.rate), delivery=delivery, details=details, error=error)


async def _measure(call: Callable[[int], Awaitable[int]], server: BrokerProcess | RedisServer, params: SendParams,
                   batch: int, latencies_s: list[float]) -> tuple[LoadStats, dict[str, float]]:
    warm = await drive(range(params.workers * 2), call, workers=params.workers, time_limit_s=20)
    if warm.errors:
        raise RuntimeError(f"warm-up failed: {warm.error_samples}")
    latencies_s.clear()
    meter = ServerMeter(server).start()
    stats = await drive(range(params.messages // batch), call, workers=params.workers,
                        time_limit_s=params.time_limit_s)
    return stats, meter.stop()


async def rocketq_send(broker: BrokerProcess, params: SendParams, body_bytes: int, *, batched: bool,
                       topic: str) -> Side:
    """`Producer.send` (batched=False) or `Producer.send_batch` of 32 of `body_bytes` messages."""
    body = bytes(body_bytes)
    await create_topic(broker.address, topic, QUEUES)
    acked: list[int] = []      # queue_id << 32 | queue_offset of every acknowledged message
    latencies: list[float] = []
    batch = BATCH_SIZE if batched else 1
    async with Producer(PRODUCER_GROUP, broker.address, send_msg_timeout_ms=SEND_TIMEOUT_MS) as producer:
        async def call(index: int) -> int:
            started = time.perf_counter()
            if batched:
                result = await producer.send_batch([Message(topic=topic, body=body) for _ in range(batch)])
            else:
                result = await producer.send(Message(topic=topic, body=body))
            latencies.append(time.perf_counter() - started)
            base = result.queue_id << 32 | result.queue_offset
            acked.extend(range(base, base + batch))
            return batch

        stats, cpu = await _measure(call, broker, params, batch, latencies)
    offsets = await max_offsets(broker.address, topic, QUEUES)
    stored = [q << 32 | o for q, top in enumerate(offsets) for o in range(top)]
    return _side(stats, cpu, latencies, Delivery.of(stored, acked))


async def redis_send(server: RedisServer, params: SendParams, body_bytes: int, *, batched: bool,
                     stream: str) -> Side:
    """XADD one at a time (batched=False) or pipelines of 32 XADD, `workers` connections."""
    body = bytes(body_bytes)
    acked: list[bytes | str] = []
    latencies: list[float] = []
    batch = BATCH_SIZE if batched else 1
    client: aioredis.Redis = server.client(max_connections=params.workers + 2)
    try:
        async def call(index: int) -> int:
            started = time.perf_counter()
            if batched:
                pipe = client.pipeline(transaction=False)
                for _ in range(batch):
                    pipe.xadd(stream, {FIELD: body})
                ids = await pipe.execute()
                acked.extend(ids)
            else:
                acked.append(await client.xadd(stream, {FIELD: body}))
            latencies.append(time.perf_counter() - started)
            return batch

        stats, cpu = await _measure(call, server, params, batch, latencies)
        stored = await client.xlen(stream)
        await client.delete(stream)   # keeps the server's RSS and the AOF small for later rows
    finally:
        await client.aclose()
    unique = len(set(acked))
    delivery = Delivery(expected=stored, delivered=len(acked), missing=max(0, stored - unique),
                        duplicates=len(acked) - unique, unexpected=max(0, unique - stored))
    return _side(stats, cpu, latencies, delivery)
