"""Wake latency: how soon a blocked reader gets a message once it is sent.

One reader connection keeps a blocking read open at the end of a one-queue topic / one stream; a
sender connection sends one message every `interval_ms`. rocketq: a held pull
(`ClientAPI.pull_message`, SUSPEND, suspend_timeout_ms 30000) and `Producer.send`; Redis:
`XREAD COUNT 32 BLOCK 30000 STREAMS s <last id>` and XADD on a second client. The latency is the
read's reply arrival minus the instant just before the send is issued (the send's ack and the
read's reply race; the ack is not waited for first). The message body is its index, so every
message must arrive exactly once. Also measured, as the floor: the round trip of a trivial request
at the same spacing (rocketq GET_MAX_OFFSET, Redis PING)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from bench.broker_proc import BrokerProcess
from bench.client_produce import create_topic
from bench.common import PRODUCER_GROUP, connected, pull_header
from bench.peers.consume import entries_of
from bench.peers.results import Delivery, Side
from bench.peers.servers import RedisServer, ServerMeter
from bench.report import percentile
from client import Message, Producer
from protocol.model import PullStatus

WARMUP = 20
HOLD_MS = 30_000
FIELD = b"body"


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeParams:
    sends: int
    interval_ms: float
    floor_samples: int
    time_limit_s: float


FULL = WakeParams(sends=2_000, interval_ms=10.0, floor_samples=200, time_limit_s=60.0)
QUICK = WakeParams(sends=200, interval_ms=10.0, floor_samples=50, time_limit_s=10.0)

Wait = Callable[[], Coroutine[Any, Any, list[int]]]     # one blocking read: the indexes of the messages it got
Send = Callable[[int], Coroutine[Any, Any, None]]
Probe = Callable[[], Awaitable[object]]


@dataclass(slots=True)
class WakeRun:
    wake_ms: list[float]
    received: list[int]
    sent: list[int]
    failures: list[str]


async def wake_loop(wait: Wait, send: Send, resync: Callable[[], Awaitable[None]], params: WakeParams) -> WakeRun:
    """WARMUP + `sends` rounds: start a read, let it block until the next tick, send, time the read."""
    run = WakeRun([], [], [], [])
    interval_s = params.interval_ms / 1000
    started = time.perf_counter()
    deadline = started + params.time_limit_s

    async def timed_wait() -> tuple[list[int], float]:
        indexes = await wait()
        return indexes, time.perf_counter()

    for index in range(WARMUP + params.sends):
        if time.perf_counter() >= deadline:
            run.failures.append(f"time limit reached after {index} sends")
            break
        read = asyncio.create_task(timed_wait())
        await asyncio.sleep(max(0.0, started + (index + 1) * interval_s - time.perf_counter()))
        if read.done():
            outcome = repr(read.exception()) if read.exception() else f"got {read.result()[0]}"
            run.failures.append(f"read answered before send {index}: {outcome}")
            if not read.exception():
                run.received += read.result()[0]
            await resync()
            continue
        send_started = time.perf_counter()
        sending = asyncio.create_task(send(index))
        run.sent.append(index)
        try:
            async with asyncio.timeout(5):
                indexes, arrived = await read
                await sending
        except Exception as exc:
            read.cancel()
            sending.cancel()
            await asyncio.gather(read, sending, return_exceptions=True)
            run.failures.append(f"send {index}: {type(exc).__name__}: {exc}")
            if len(run.failures) > 20:
                break
            await resync()
            continue
        run.received += indexes
        if indexes != [index]:
            run.failures.append(f"send {index}: the read returned {indexes}")
        elif index >= WARMUP:
            run.wake_ms.append((arrived - send_started) * 1000)
    return run


async def rtt_floor(probe: Probe, count: int, interval_s: float) -> list[float]:
    rtts = []
    for _ in range(count):
        await asyncio.sleep(interval_s)
        started = time.perf_counter()
        await probe()
        rtts.append((time.perf_counter() - started) * 1000)
    return sorted(rtts)


def _sides(run: WakeRun, floor: list[float], cpu: dict[str, float], params: WakeParams) -> tuple[Side, Side]:
    """(p50 side, p99 side); the p99 side carries the delivery check and the details."""
    wake = sorted(run.wake_ms)
    details = {"samples": len(wake), "failures": len(run.failures), "failure_samples": run.failures[:5],
               **{f"wake_{name}_ms": round(percentile(wake, q), 3)
                  for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999), ("max", 1.0))},
               "rtt_floor_p50_ms": round(percentile(floor, 0.5), 3),
               "rtt_floor_p99_ms": round(percentile(floor, 0.99), 3), **cpu}
    error = None if len(wake) >= params.sends * 0.99 else f"only {len(wake)} of {params.sends} wake-ups measured"
    p99 = Side(value=round(percentile(wake, 0.99), 3), delivery=Delivery.of(run.sent, run.received),
               details=details, error=error)
    return Side(value=round(percentile(wake, 0.5), 3), error=error), p99


async def rocketq_wake(broker: BrokerProcess, params: WakeParams) -> tuple[Side, Side]:
    address, topic = broker.address, f"peers_wake_{time.monotonic_ns()}"
    await create_topic(address, topic, 1)
    queue_offset = 0
    async with connected(address, 1) as pullers, Producer(PRODUCER_GROUP, address) as producer:
        puller = pullers[0]

        async def wait() -> list[int]:
            nonlocal queue_offset
            header = pull_header(topic, 0, queue_offset, max_msg_nums=32, suspend_timeout_ms=HOLD_MS)
            pulled = await puller.pull_message(address, header, timeout_ms=HOLD_MS + 5_000)
            if pulled.status is PullStatus.FOUND:
                queue_offset = pulled.next_begin_offset
            return [int(m.body) for m in pulled.messages]

        async def send(index: int) -> None:
            await producer.send(Message(topic=topic, body=str(index).encode()))

        async def resync() -> None:
            nonlocal queue_offset
            queue_offset = await puller.get_max_offset(address, topic, 0)

        await producer.send(Message(topic=topic, body=b"-1"))   # route known, connection open
        await resync()
        meter = ServerMeter(broker).start()
        run = await wake_loop(wait, send, resync, params)
        cpu = meter.stop()
        floor = await rtt_floor(lambda: puller.get_max_offset(address, topic, 0), params.floor_samples,
                                params.interval_ms / 1000)
    return _sides(run, floor, cpu, params)


async def redis_wake(server: RedisServer, params: WakeParams) -> tuple[Side, Side]:
    stream = f"peers_wake_{time.monotonic_ns()}"
    reader = aioredis.Redis(host="127.0.0.1", port=server.port, single_connection_client=True, socket_timeout=None)
    sender = aioredis.Redis(host="127.0.0.1", port=server.port, single_connection_client=True)
    last_id: bytes | str = b"0"
    try:
        async def wait() -> list[int]:
            nonlocal last_id
            entries = entries_of(await reader.xread({stream: last_id}, count=32, block=HOLD_MS))
            if entries:
                last_id = entries[-1][0]
            return [int(fields[FIELD]) for _, fields in entries]

        async def send(index: int) -> None:
            await sender.xadd(stream, {FIELD: str(index).encode()})

        async def resync() -> None:
            nonlocal last_id
            newest = await sender.xrevrange(stream, count=1)
            last_id = (newest[0][0] or b"0") if newest else b"0"

        await sender.xadd(stream, {FIELD: b"-1"})
        await resync()
        meter = ServerMeter(server).start()
        run = await wake_loop(wait, send, resync, params)
        cpu = meter.stop()
        floor = await rtt_floor(sender.ping, params.floor_samples, params.interval_ms / 1000)
        await sender.delete(stream)
    finally:
        await reader.aclose()
        await sender.aclose()
    return _sides(run, floor, cpu, params)
