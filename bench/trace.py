"""`trace_cost`: what the broker-recorded message trace (issue #42, `[trace]`) costs, against a
broker process with `trace.enabled` false and true (ASYNC_FLUSH: the broker's CPU, not the disk,
bounds the rate, so a cost shows in full). The sizes and senders are `auth_cost`'s.

- `trace.send_one.128B.{off,on}`: one SEND_MESSAGE per request (each with a UNIQ_KEY, as a
  producer's), `one_workers` in flight; every send is one trace event;
- `trace.send_batch.128B.{off,on}`: SEND_BATCH_MESSAGE of 32 (one trace record per batch),
  `batch_workers` in flight;
- `trace.e2e.128B.{off,on}`: the single sends while one puller per queue reads them with long
  polling and commits its offset on every pull (COMMIT_OFFSET): every message is sent, stored,
  delivered and committed; the rate is messages over the time from the first send until every
  message was pulled;
- `....on_vs_off`: the rate with the trace on as a percentage of off (issue #42's target: ≥ 95 %,
  i.e. ≤ 5 % cost); `.broker_us_per_msg.{off,on}`: broker CPU per message.

Each of `rounds` rounds starts a fresh broker with the trace off and one with it on, side by side,
and sends to them in alternating slices (`bench.paired`, as `auth_cost`): the ratio row is the
median over every adjacent pair of slices, the others the slices' medians."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from bench.auth import TOPIC, AuthParams, clients, prepare, slice_runner, warmed_sender
from bench.broker_proc import BrokerProcess
from bench.common import BATCH_SIZE, CONSUMER_GROUP, CpuMeter, Options, drive, note_neighbours
from bench.paired import PairedRows, Slice, alternate, side_by_side
from bench.report import BenchResult
from client.api import ClientAPI
from protocol.codes import PullSysFlag, RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import error_for
from protocol.headers import PullMessageRequestHeader

TARGET_PERCENT = 95.0
# 20 rounds of 8 slices: 160 pairs a row. One pair's ratio spreads 50-170 % on this machine (its
# speed for the same work moves by tens of per cent between adjacent 0.3 s slices); with 40 pairs the
# median's standard error was 2.7-6 points: an A/A run (both brokers with the trace off, November 27)
# read 98.8, 97.3 and 106.1 %, against a cost of ~2.5-3 % counted in instructions (`python -m
# bench.instructions send|consume --trace on|off`, which no other load moves). 4x the pairs halves it.
FULL = AuthParams(one_messages=6_000, one_workers=64, batch_messages=96_000, batch_workers=32, time_limit_s=8.0,
                  rounds=20, slices=8)
QUICK = AuthParams(one_messages=2_000, one_workers=64, batch_messages=20_000, batch_workers=32, time_limit_s=3.0,
                   rounds=2, slices=2)


async def _puller(api: ClientAPI, address: str, queue_id: int, first_offset: int, wanted: int,
                  deadline: float) -> tuple[int, int]:
    """Pull queue `queue_id` from `first_offset` (long polling, committing each time) until `wanted`
    came: (messages received, the next queue offset)."""
    queue_offset, received = first_offset, 0
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
        received += next_offset - queue_offset if response.code == ResponseCode.SUCCESS else 0
        queue_offset = next_offset
    return received, queue_offset


async def measure_pair(result: BenchResult, brokers: dict[bool, BrokerProcess], kind: str,
                       params: AuthParams) -> dict[bool, list[Slice]]:
    """One round against a broker with the trace off (False) and one with it on (True), both
    prepared and warmed first, `params.slices` slices each (`bench.paired.alternate`)."""
    async with contextlib.AsyncExitStack() as stack:
        runners = {}
        for on, broker in brokers.items():
            await prepare(broker.address, params, False)
            apis = await stack.enter_async_context(clients(broker.address, params.connections, None))
            label = f"trace.{kind}.{'on' if on else 'off'}"
            sent = await warmed_sender("send_batch" if kind == "send_batch" else "send_one", apis, broker.address,
                                       params)
            if kind == "e2e":
                pullers = await stack.enter_async_context(clients(broker.address, 2, None))
                runners[on] = _e2e_runner(result, broker, label, *sent, pullers, params)
            else:
                runners[on] = slice_runner(result, broker, label, *sent, params)
        return await alternate(runners, params.slices)


def _e2e_runner(result: BenchResult, broker: BrokerProcess, label: str, call: Callable[[int], Awaitable[int]],
                count: int, workers: int, pullers: list[ClientAPI],
                params: AuthParams) -> Callable[[int], Awaitable[Slice]]:
    """Slice i: `count` single sends while a puller per queue reads them (from where the last slice
    left it: the warm-up put 8 in each queue); the rate is messages over the time from the first
    send until every message was pulled."""
    offsets = [8] * params.queues

    async def run(index: int) -> Slice:
        first = params.queues * 8 + index * count
        meter = CpuMeter(broker)
        meter.start()
        started = time.perf_counter()
        deadline = started + params.time_limit_s * 3
        reads = [asyncio.create_task(_puller(pullers[q % 2], broker.address, q, offsets[q], count // params.queues,
                                             deadline)) for q in range(params.queues)]
        stats = await drive(range(first, first + count), call, workers=workers, time_limit_s=params.time_limit_s)
        pulled = await asyncio.gather(*reads)
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
        note_neighbours(result, label, cpu)
        received = sum(n for n, _ in pulled)
        offsets[:] = [offset for _, offset in pulled]
        if stats.errors or received < stats.messages:
            result.ok = False
            result.error = f"{label}: {stats.errors} failed sends, {received} of {stats.messages} pulled"
        per_message_us = elapsed / max(stats.messages, 1) * 1e6
        return (stats.messages / elapsed, cpu["broker_cores"] * per_message_us,
                cpu["client_cores"] * per_message_us)
    return run


async def trace_cost(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "batch_size": BATCH_SIZE}
    result.notes.append("ASYNC_FLUSH; trace on: the defaults of [trace] (100 ms flushes to <store>/trace)")
    result.notes.append("the broker with the trace off and the one with it on run side by side, sent to "
                        "in alternating slices; on_vs_off is the median of adjacent slices' ratios")
    for kind in ("send_one", "send_batch", "e2e"):
        rows = PairedRows()
        for round_index in range(params.rounds):
            settings = {"store.flush_disk_type": "ASYNC_FLUSH"}
            async with side_by_side(opts, {False: {**settings, "trace.enabled": "false"},
                                           True: {**settings, "trace.enabled": "true"}}, round_index) as brokers:
                rows.add_round(await measure_pair(result, brokers, kind, params))
        rows.report(result, f"trace.{kind}.{params.body_bytes}B", TARGET_PERCENT, client=False)
