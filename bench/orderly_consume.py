"""`orderly_consume`: end-to-end orderly consumption through the public `PushConsumer`
(`register_listener(fn, orderly=True)`): one ASYNC_FLUSH broker process, a topic of 8 queues
filled with a backlog of 128 B messages (`Producer.send_batch` of 32), then one orderly consumer
per listener kind (`async def`, then sync `def`) reading it from the first offset with
`consume_message_batch_max_size` 1 (one listener call per message). The fill and the checks are
`client_consume`'s.

The rate is the backlog over the time from `start()` until every (queue_id, queue_offset) below
the broker's max offsets reached the listener. Target (issue 9): ≥ 50,000 msg/s with the
`async def` listener; the sync `def` listener is held to the same since its batches run several
per thread hop (35,000 msg/s with a hop per batch, 107-113k since: issue 14). Checks: nothing
missing, and per queue the offsets reached the listener in strictly increasing order (a single
consumer never needs to replay)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

from bench.broker_proc import BrokerProcess
from bench.client_consume import BACKLOG_TOPIC, ConsumeParams, Tally, _fail, _fill, _record_check, check, expected_keys
from bench.client_consume import wait_all_consumed as wait_all_seen
from bench.common import CpuMeter, Options, note_neighbours, running_broker
from bench.report import BenchResult
from client import ConsumeOrderlyStatus, PushConsumer
from client.consumer.listener import OrderlyMessageListener

TARGET_ASYNC_MSG_S = 50_000.0
TARGET_SYNC_MSG_S = 50_000.0
SUCCESS = ConsumeOrderlyStatus.SUCCESS


FULL = ConsumeParams(backlog_messages=400_000, queues=8, body_bytes=128, consumer_counts=(1,),
                     consume_message_batch_max_size=1, pull_batch_size=32, fill_workers=32, fill_time_limit_s=60,
                     consume_time_limit_s=90, live_seconds=0, live_rate_msg_s=0, live_senders=0)
QUICK = ConsumeParams(backlog_messages=40_000, queues=8, body_bytes=128, consumer_counts=(1,),
                      consume_message_batch_max_size=1, pull_batch_size=32, fill_workers=32, fill_time_limit_s=15,
                      consume_time_limit_s=20, live_seconds=0, live_rate_msg_s=0, live_senders=0)


def orderly_listener(tally: Tally, kind: str) -> OrderlyMessageListener:
    """An orderly listener that records what it gets in `tally` ("sync" or "async")."""
    return tally.answering(SUCCESS, kind)


def out_of_order(seen: list[int]) -> int:
    """How many deliveries did not follow their queue's previous one with a higher offset."""
    last: dict[int, int] = {}
    bad = 0
    for key in seen:
        queue_id, queue_offset = key >> 32, key & 0xFFFFFFFF
        if queue_offset <= last.get(queue_id, -1):
            bad += 1
        last[queue_id] = queue_offset
    return bad


async def _run(result: BenchResult, broker: BrokerProcess, params: ConsumeParams, kind: str,
               expected: set[int]) -> None:
    label = f"orderly_consume.backlog.{kind}.x1"
    tally = Tally()
    consumer = PushConsumer(f"bench_orderly_{kind}", broker.address,
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            consume_message_batch_max_size=params.consume_message_batch_max_size,
                            pull_batch_size=params.pull_batch_size)
    consumer.subscribe(BACKLOG_TOPIC, "*")
    consumer.register_listener(orderly_listener(tally, kind), orderly=True)
    meter = CpuMeter(broker)
    meter.start()
    started = time.perf_counter()
    try:
        await consumer.start()
        done_at = await wait_all_seen(tally, expected, started + params.consume_time_limit_s)
        cpu = meter.stop()
    finally:
        await consumer.shutdown()
    elapsed = (done_at or time.perf_counter()) - started
    rate = len(expected) / elapsed if done_at is not None else float("nan")
    result.add(label, round(rate) if rate == rate else rate, "msg/s",
               ("≥", TARGET_ASYNC_MSG_S if kind == "async" else TARGET_SYNC_MSG_S))
    result.add(f"{label}.client_cpu", cpu["client_cores"], "cores")
    result.add(f"{label}.broker_cpu", cpu["broker_cores"], "cores")
    outcome = check(tally, expected)
    _record_check(result, label, outcome)
    disorder = out_of_order(tally.seen)
    result.add(f"{label}.out_of_order", disorder, "msgs", ("≤", 0))
    if disorder:
        _fail(result, f"{label}: {disorder} deliveries out of queue-offset order")
    result.details[label] = {**asdict(outcome), "elapsed_s": round(elapsed, 3), "completed": done_at is not None,
                             "out_of_order": disorder, **cpu}
    note_neighbours(result, label, cpu)


async def orderly_consume(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "flush_disk_type": "ASYNC_FLUSH"}
    result.notes += ["one ASYNC_FLUSH broker process; the consumer runs in this bench process",
                     "listeners record each message's queue offset (one list.extend per call) to find gaps"]
    async with running_broker(opts, {"store.flush_disk_type": "ASYNC_FLUSH"}) as broker:
        offsets = await _fill(result, broker.address, params)
        expected = expected_keys(offsets)
        await asyncio.sleep(1.0)   # let the fill's reput and flush settle
        for kind in ("async", "sync"):
            await _run(result, broker, params, kind, expected)
