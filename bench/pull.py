"""`pull`: throughput of pulls of 32 from a 1,000,000-message backlog of 128 B messages, one pull
loop per queue, all queues at once. The backlog is filled with batched sends on an ASYNC_FLUSH
broker first (the fill rate is reported too, but it is not the measured quantity).

The backlog is read twice, each time checking that every queue yields exactly what was sent:
- `pull.128B.x32`: with `ClientAPI.pull_message`, which decodes every message into a `MessageExt`
  (what a consumer pays);
- `pull.128B.x32.raw`: the same PULL_MESSAGE requests on the same `RemotingClient`, counting the
  messages of each body with msgpack's C `skip()` instead of decoding them, so the client is not
  the bottleneck and the number is the broker's.
The client's decode cost per message is measured apart, on one captured body."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import msgpack

from bench.broker_proc import BrokerProcess
from bench.common import (
    BATCH_SIZE,
    Clients,
    Options,
    broker_with_clients,
    cpu_measured,
    pull_header,
    send_batches,
    synthetic_batches,
)
from bench.report import BenchResult
from client.api import ClientAPI
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import error_for
from protocol.headers import PullMessageResponseHeader
from protocol.message import decode_message_batch
from protocol.model import PullStatus

PullOnce = Callable[[ClientAPI, str, "QueueProgress", int], Awaitable[int]]

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
    def sent(index: int, queue_id: int, messages: int) -> None:
        sent_per_queue[queue_id] += messages

    stats = await send_batches(clients, address, TOPIC, params.queues, synthetic_batches(TOPIC, 128, BATCH_SIZE),
                               params.messages // BATCH_SIZE, workers=32, time_limit_s=params.fill_time_limit_s,
                               on_sent=sent)
    result.add("pull.fill_send_batch.128B.ASYNC_FLUSH", round(stats.rate), "msg/s")
    result.details["fill"] = {"messages": stats.messages, "elapsed_s": round(stats.elapsed_s, 3),
                              "errors": stats.errors, "error_samples": stats.error_samples,
                              "flush": "ASYNC_FLUSH"}
    if stats.errors or stats.timed_out:
        result.notes.append(f"fill stopped early: {stats.messages} messages, {stats.errors} errors")


async def pull_decoded(api: ClientAPI, address: str, progress: QueueProgress, max_msg_nums: int) -> int:
    """One `ClientAPI.pull_message` (every message decoded); returns how many messages came."""
    header = pull_header(TOPIC, progress.queue_id, progress.queue_offset, max_msg_nums=max_msg_nums,
                         suspend_timeout_ms=1_000)
    pulled = await api.pull_message(address, header, timeout_ms=10_000)
    if pulled.status is PullStatus.FOUND and pulled.messages:
        if pulled.messages[0].queue_offset != progress.queue_offset:
            progress.gaps += 1
        if pulled.next_begin_offset != progress.queue_offset + len(pulled.messages):
            progress.gaps += 1
    progress.queue_offset = pulled.next_begin_offset
    return len(pulled.messages)


async def pull_raw(api: ClientAPI, address: str, progress: QueueProgress, max_msg_nums: int) -> int:
    """The same PULL_MESSAGE, counting the body's messages without decoding them."""
    header = pull_header(TOPIC, progress.queue_id, progress.queue_offset, max_msg_nums=max_msg_nums,
                         suspend_timeout_ms=1_000)
    response = await api.remoting.invoke(address, request(RequestCode.PULL_MESSAGE, header), 10_000)
    if response.code not in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND):
        raise error_for(response.code, response.remark)
    next_begin_offset = PullMessageResponseHeader.from_fields(response.fields).next_begin_offset
    count = 0
    if response.code == ResponseCode.SUCCESS:
        unpacker = msgpack.Unpacker()
        unpacker.feed(response.body_bytes())
        try:
            while True:
                unpacker.skip()
                count += 1
        except msgpack.OutOfData:
            pass
        if next_begin_offset != progress.queue_offset + count:
            progress.gaps += 1
    progress.queue_offset = next_begin_offset
    return count


async def _pull_queue(clients: Clients, address: str, progress: QueueProgress, max_msg_nums: int,
                      deadline: float, pull_once: PullOnce) -> None:
    """Pull from offset 0 until `expected` messages arrived or the deadline passes. A pull at the
    end (the reput is behind) waits up to 1 s as a held pull rather than spinning."""
    api = clients[progress.queue_id]
    while progress.received < progress.expected and time.perf_counter() < deadline:
        count = await pull_once(api, address, progress, max_msg_nums)
        progress.pulls += 1
        progress.received += count
        if not count:
            progress.empty_pulls += 1


async def _read_backlog(result: BenchResult, broker: BrokerProcess, clients: Clients, params: PullParams,
                        sent_per_queue: list[int], name: str, pull_once: PullOnce) -> None:
    """Read every queue from offset 0 with `pull_once`, one loop per queue; adds `name` metrics
    and fails the result when a count is off."""
    progress = [QueueProgress(q, sent_per_queue[q]) for q in range(params.queues)]
    with cpu_measured(result, broker, name) as cpu:
        started = time.perf_counter()
        deadline = started + params.pull_time_limit_s
        async with asyncio.timeout(params.pull_time_limit_s + 30):
            await asyncio.gather(*(_pull_queue(clients, broker.address, p, params.max_msg_nums, deadline,
                                               pull_once) for p in progress))
        elapsed = time.perf_counter() - started
    received, sent = sum(p.received for p in progress), sum(sent_per_queue)
    rate = received / elapsed if elapsed > 0 else float("nan")
    result.add(name, round(rate), "msg/s", ("≥", PULL_TARGET_MSG_S))
    result.add(f"{name}.broker_cpu", cpu["broker_cores"], "cores")
    result.add(f"{name}.client_cpu", cpu["client_cores"], "cores")
    result.add(f"{name}.count_mismatch", abs(received - sent), "msgs", ("≤", 0))
    gaps = sum(p.gaps for p in progress)
    result.details[name] = {
        "sent": sent, "received": received, "elapsed_s": round(elapsed, 3), **cpu,
        "pulls": sum(p.pulls for p in progress), "empty_pulls": sum(p.empty_pulls for p in progress),
        "offset_gaps": gaps, "per_queue": [asdict(p) for p in progress]}
    if received != sent or gaps:
        result.ok = False
        result.error = f"{name}: received {received} of {sent} sent messages ({gaps} offset gaps)"


async def _decode_cost_us(clients: Clients, address: str) -> float:
    """Client CPU per message of `decode_message_batch` on one full pull body, in microseconds."""
    response = await clients[0].remoting.invoke(address, request(RequestCode.PULL_MESSAGE, pull_header(
        TOPIC, 0, 0, max_msg_nums=32)), 10_000)
    body = response.body_bytes()
    count, rounds = len(decode_message_batch(body)), 200
    started = time.process_time()
    for _ in range(rounds):
        decode_message_batch(body)
    return (time.process_time() - started) / (rounds * max(count, 1)) * 1e6


async def pull(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = asdict(params)
    result.notes.append("backlog filled with SEND_BATCH_MESSAGE of 32 on an ASYNC_FLUSH broker")
    settings = {"store.flush_disk_type": "ASYNC_FLUSH"}
    async with broker_with_clients(opts, params.connections, settings) as (broker, clients):
        address = broker.address
        await clients[0].create_topic(address, TOPIC, queue_nums=params.queues)
        sent_per_queue = [0] * params.queues
        await _fill(clients, address, params, sent_per_queue, result)
        await asyncio.sleep(1.0)   # let the fill's reput and flush settle before measuring
        await _read_backlog(result, broker, clients, params, sent_per_queue, "pull.128B.x32.raw", pull_raw)
        await _read_backlog(result, broker, clients, params, sent_per_queue, "pull.128B.x32", pull_decoded)
        result.add("pull.client_decode_cost", round(await _decode_cost_us(clients, address), 2), "us/msg")
