"""`trace_cost`: what the broker-recorded message trace (issue #42, `[trace]`) costs, against a
broker process with `trace.enabled` false and true (ASYNC_FLUSH: the broker's CPU, not the disk,
bounds the rate, so a cost shows in full).

- `trace.send_one.128B.{off,on}`: one SEND_MESSAGE per request (each with a UNIQ_KEY and a KEYS
  word, as a producer's), `one_workers` in flight; every send is one trace event;
- `trace.e2e.128B.{off,on}`: the same sends while one puller per queue reads them with long
  polling and commits its offset on every pull (COMMIT_OFFSET): every message is sent, stored,
  delivered and committed, four of the trace's events; the rate is messages over the time from the
  first send until every message was pulled;
- `....on_vs_off`: the rate with the trace on as a percentage of off (issue #42's target: ≥ 95 %,
  i.e. ≤ 5 % cost); `.broker_us_per_msg.{off,on}`: broker CPU per message (steadier than rates).

Off and on alternate `rounds` times, each on its own fresh broker; medians are reported."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass

from bench.broker_proc import BrokerProcess
from bench.common import (
    CONSUMER_GROUP,
    PRODUCER_GROUP,
    Clients,
    CpuMeter,
    Options,
    drive,
    note_neighbours,
    running_broker,
)
from bench.report import BenchResult
from client.admin_api import AdminAPI
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.codes import PullSysFlag, RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import error_for
from protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader

TOPIC = "bench_trace"
TARGET_PERCENT = 95.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceParams:
    messages: int
    one_workers: int
    time_limit_s: float
    rounds: int
    queues: int = 8
    connections: int = 2
    body_bytes: int = 128


FULL = TraceParams(messages=60_000, one_workers=64, time_limit_s=8.0, rounds=3)
QUICK = TraceParams(messages=8_000, one_workers=64, time_limit_s=3.0, rounds=1)


def _sender(clients: Clients, address: str, params: TraceParams, run: int):  # type: ignore[no-untyped-def]
    body = bytes(params.body_bytes)

    async def one(index: int) -> int:
        header = SendMessageRequestHeader(producer_group=PRODUCER_GROUP, topic=TOPIC, queue_id=index % params.queues,
                                          born_timestamp=0, properties={"UNIQ_KEY": f"BENCHTRACE{run:06X}{index:016X}",
                                                                        "KEYS": f"order-{index}"})
        await clients[index].send_message(address, header, body, timeout_ms=10_000)
        return 1
    return one


async def _puller(api: ClientAPI, address: str, queue_id: int, wanted: int, deadline: float) -> int:
    """Pull queue `queue_id` from 0 (long polling, committing each time) until `wanted` came."""
    queue_offset, received = 0, 0
    flags = int(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND | PullSysFlag.COMMIT_OFFSET)
    while received < wanted and time.perf_counter() < deadline:
        header = PullMessageRequestHeader(consumer_group=CONSUMER_GROUP, topic=TOPIC, queue_id=queue_id,
                                          queue_offset=queue_offset, max_msg_nums=32, sys_flag=flags,
                                          commit_offset=queue_offset, suspend_timeout_ms=1_000, sub_version=0,
                                          subscription="*", expression_type="TAG")
        response = await api.remoting.invoke(address, request(RequestCode.PULL_MESSAGE, header), 10_000)
        if response.code not in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND):
            raise error_for(response.code, response.remark)
        next_offset = response.fields["next_begin_offset"]
        if response.code == ResponseCode.SUCCESS:
            received += next_offset - queue_offset
        queue_offset = next_offset
    return received


async def measure(result: BenchResult, broker: BrokerProcess, kind: str, on: bool, params: TraceParams,
                  run: int) -> tuple[float, float]:
    """One run: messages/s and broker CPU µs per message."""
    admin = AdminAPI(RemotingClient())
    try:
        await admin.create_topic(broker.address, TOPIC, queue_nums=params.queues)
    finally:
        await admin.remoting.close()
    clients, pullers = Clients(params.connections), Clients(2)
    try:
        await clients.connect(broker.address)
        await pullers.connect(broker.address)
        call = _sender(clients, broker.address, params, run)
        warm = await drive(range(params.queues * 8), call, workers=params.queues, time_limit_s=10)
        if warm.errors:
            raise RuntimeError(f"warm-up sends failed: {warm.error_samples}")
        sends = range(params.queues * 8, params.queues * 8 + params.messages)
        meter = CpuMeter(broker)
        meter.start()
        started = time.perf_counter()
        if kind == "e2e":
            per_queue = params.queues * 8 + params.messages
            deadline = started + params.time_limit_s * 3
            reads = [asyncio.create_task(_puller(pullers[q], broker.address, q, per_queue // params.queues, deadline))
                     for q in range(params.queues)]
            stats = await drive(sends, call, workers=params.one_workers, time_limit_s=params.time_limit_s)
            received = sum(await asyncio.gather(*reads))
            elapsed = time.perf_counter() - started
            messages = stats.messages
            if received < per_queue - params.queues:      # every sent message must have been pulled
                result.ok = False
                result.error = f"trace.e2e: {received} of {per_queue} messages pulled"
        else:
            stats = await drive(sends, call, workers=params.one_workers, time_limit_s=params.time_limit_s)
            elapsed, messages = stats.elapsed_s, stats.messages
        cpu = meter.stop()
    finally:
        await clients.close()
        await pullers.close()
    note_neighbours(result, f"trace.{kind}.{'on' if on else 'off'}", cpu)
    if stats.errors:
        result.ok = False
        result.error = f"trace.{kind}: {stats.errors} failed sends, e.g. {stats.error_samples[:1]}"
    per_message_us = elapsed / max(messages, 1) * 1e6
    return messages / elapsed, cpu["broker_cores"] * per_message_us


async def trace_cost(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = asdict(params)
    result.notes.append("ASYNC_FLUSH; trace on: the defaults of [trace] (100 ms flushes to <store>/trace)")
    for kind in ("send_one", "e2e"):
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu_us: dict[bool, list[float]] = {False: [], True: []}
        for run in range(params.rounds):
            for on in (False, True):
                settings = {"store.flush_disk_type": "ASYNC_FLUSH", "trace.enabled": "true" if on else "false"}
                async with running_broker(opts, settings) as broker:
                    rate, us = await measure(result, broker, kind, on, params, run)
                rates[on].append(rate)
                cpu_us[on].append(us)
        label = f"trace.{kind}.{params.body_bytes}B"
        off, on_rate = statistics.median(rates[False]), statistics.median(rates[True])
        result.add(f"{label}.off", round(off), "msg/s")
        result.add(f"{label}.on", round(on_rate), "msg/s")
        result.add(f"{label}.on_vs_off", round(100 * on_rate / off, 1), "%", ("≥", TARGET_PERCENT))
        for on in (False, True):
            result.add(f"{label}.broker_us_per_msg.{'on' if on else 'off'}", round(statistics.median(cpu_us[on]), 2),
                       "µs")
        result.details[label] = {"rates_off": [round(r) for r in rates[False]],
                                 "rates_on": [round(r) for r in rates[True]],
                                 "broker_us_off": [round(u, 2) for u in cpu_us[False]],
                                 "broker_us_on": [round(u, 2) for u in cpu_us[True]],
                                 "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
