"""`retry`: the cost of one retry round trip (CONSUMER_SEND_MSG_BACK: look the message up, store
the copy in the schedule topic, fsync, answer) and the schedule service's delivery rate for
100,000 due messages (issue 7's target: >= 50,000 msg/s on the 2-core machine).

Send-back: messages are stored and pulled once, then handed back one request at a time (latency
and broker CPU per round trip) and with 32 in flight (throughput), against a SYNC_FLUSH broker (each
send-back waits for its fsync, whose kernel time counts as broker CPU) and an ASYNC_FLUSH one.

Delivery: 100,000 messages are sent with delay level 1 to a broker whose level 1 is one hour, the
broker is stopped and restarted with level 1 = 1 ms. Every stored due time is then more than one
level-delay ahead, which RocketMQ's clamp treats as due now, so all 100,000 are due at once (the
schedule service starts delivering before the broker even listens). The rate is the count over the
span of the delivered copies' store timestamps (first to last), read back by pulling them all."""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.broker_proc import BrokerProcess
from bench.common import CpuMeter, Options, connected, drive, note_neighbours, pull_header, store_root
from bench.report import BenchResult, percentile
from client.api import ClientAPI
from protocol.headers import SendMessageRequestHeader
from protocol.message import MessageExt

DELIVERY_TARGET_MSG_S = 50_000.0
GROUP = "bench_retry"
TOPIC = "bench_retry"
DUE_TOPIC = "bench_due"
QUEUES = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryParams:
    send_backs: int
    due_messages: int
    time_limit_s: float


FULL = RetryParams(send_backs=20_000, due_messages=100_000, time_limit_s=120.0)
QUICK = RetryParams(send_backs=2_000, due_messages=10_000, time_limit_s=30.0)


async def _stored_messages(api: ClientAPI, address: str, count: int) -> list[MessageExt]:
    """Send `count` messages (64 in flight) and pull them back: send-back needs their offsets."""
    header = SendMessageRequestHeader(producer_group="bench_pg", topic=TOPIC, queue_id=0,
                                      properties={"TAGS": "t", "KEYS": "k"})
    await api.create_topic(address, TOPIC, queue_nums=1)

    async def one(_: int) -> int:
        await api.send_message(address, header, b"x" * 128, timeout_ms=10_000)
        return 1
    await drive(range(count), one, workers=64, time_limit_s=120)
    messages: list[MessageExt] = []
    while len(messages) < count:
        result = await api.pull_message(address, pull_header(TOPIC, 0, len(messages)), 10_000)
        if not result.messages:
            break
        messages.extend(result.messages)
    return messages


async def send_back_cost(result: BenchResult, opts: Options, params: RetryParams, flush: str) -> None:
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-", dir=store_root()) as directory:
        broker = BrokerProcess(Path(directory) / "store", cpus=opts.broker_cpus,
                               settings={"store.flush_disk_type": flush})
        async with broker, connected(broker.address, 2) as clients:
            api, address = clients[0], broker.address
            messages = await _stored_messages(api, address, params.send_backs)
            half = len(messages) // 4
            sequential, concurrent = messages[:half], messages[half:]
            latencies: list[float] = []
            meter = CpuMeter(broker)
            meter.start()
            for message in sequential:
                started = time.perf_counter()
                await api.consumer_send_msg_back(address, message, GROUP, 0, 16)
                latencies.append(time.perf_counter() - started)
            cpu_seq = meter.stop()
            elapsed_seq = sum(latencies)

            async def one(index: int) -> int:
                await clients[index].consumer_send_msg_back(address, concurrent[index], GROUP, 0, 16)
                return 1
            meter.start()
            stats = await drive(range(len(concurrent)), one, workers=32, time_limit_s=params.time_limit_s)
            cpu_conc = meter.stop()
    latencies.sort()
    result.add(f"send_back.{flush}.p50", percentile(latencies, 0.5) * 1000, "ms")
    result.add(f"send_back.{flush}.p99", percentile(latencies, 0.99) * 1000, "ms")
    result.add(f"send_back.{flush}.broker_cpu_per_request",
               cpu_seq["broker_cores"] * elapsed_seq / len(sequential) * 1e6, "µs")
    result.add(f"send_back.{flush}.32_in_flight", stats.rate, "msg/s")
    result.details[f"send_back_{flush}"] = {"sequential_cpu": cpu_seq, "concurrent_cpu": cpu_conc,
                                            "errors": stats.error_samples}
    note_neighbours(result, f"send-back {flush}", cpu_conc)
    if stats.errors:
        raise RuntimeError(f"{stats.errors} send-backs failed: {stats.error_samples}")


async def _max_offsets(api: ClientAPI, address: str) -> int:
    return sum([await api.get_max_offset(address, DUE_TOPIC, q) for q in range(QUEUES)])


async def _store_timestamps(api: ClientAPI, address: str) -> list[int]:
    """store_timestamp of every message of DUE_TOPIC (epoch ms)."""
    stamps: list[int] = []
    for queue_id in range(QUEUES):
        queue_offset = 0
        while True:
            result = await api.pull_message(address, pull_header(DUE_TOPIC, queue_id, queue_offset), 10_000)
            if not result.messages:
                break
            stamps.extend(m.store_timestamp for m in result.messages)
            queue_offset = result.next_begin_offset
    return stamps


async def delivery_rate(result: BenchResult, opts: Options, params: RetryParams) -> None:
    count = params.due_messages
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-", dir=store_root()) as directory:
        store = Path(directory) / "store"
        parked = {"store.message_delay_level": "1h 2h", "store.flush_disk_type": "ASYNC_FLUSH"}
        broker = BrokerProcess(store, settings=parked, cpus=opts.broker_cpus)
        async with broker, connected(broker.address, 2) as clients:
            await clients[0].create_topic(broker.address, DUE_TOPIC, queue_nums=QUEUES)
            headers = [SendMessageRequestHeader(producer_group="bench_pg", topic=DUE_TOPIC, queue_id=q,
                                                properties={"DELAY": "1", "TAGS": "t"}) for q in range(QUEUES)]
            address = broker.address

            async def one(index: int) -> int:
                await clients[index].send_message(address, headers[index % QUEUES], b"x" * 128, timeout_ms=10_000)
                return 1
            sent = await drive(range(count), one, workers=64, time_limit_s=params.time_limit_s)
        if sent.messages != count:
            raise RuntimeError(f"only {sent.messages} of {count} delayed messages were stored: {sent.error_samples}")
        due = {"store.message_delay_level": "1ms 2ms", "store.flush_disk_type": "ASYNC_FLUSH"}
        broker = BrokerProcess(store, settings=due, cpus=opts.broker_cpus)
        async with broker, connected(broker.address, 1) as clients:
            api, address = clients[0], broker.address
            deadline = time.perf_counter() + params.time_limit_s
            delivered = await _max_offsets(api, address)
            while delivered < count and time.perf_counter() < deadline:
                await asyncio.sleep(0.01)
                delivered = await _max_offsets(api, address)
            if delivered < count:
                raise RuntimeError(f"only {delivered} of {count} due messages delivered in "
                                   f"{params.time_limit_s:.0f} s")
            stored_at = await _store_timestamps(api, address)
    if len(stored_at) != count:
        raise RuntimeError(f"read back {len(stored_at)} delivered messages, expected {count}")
    span_s = (max(stored_at) - min(stored_at)) / 1000
    rate = count / span_s if span_s > 0 else float("nan")
    result.add("schedule_delivery", rate, "msg/s", ("≥", DELIVERY_TARGET_MSG_S))
    result.details.update(due_messages=count, delivery_span_s=span_s, delayed_send_rate_msg_s=round(sent.rate))


async def retry(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params.update(send_backs=params.send_backs, due_messages=params.due_messages)
    for flush in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        await send_back_cost(result, opts, params, flush)
    await delivery_rate(result, opts, params)
