"""`txn_send`: transactional send throughput (`TransactionProducer.send_message_in_transaction`:
half message, local transaction, END_TRANSACTION commit) against a plain batched send
(`Producer.send_batch` of 32) measured on the same broker in the same run; issue #38's target is
a ratio of at least 30 %.

- `txn_send.128B`: committed transactional messages per second, `workers` transactions at once, an
  `async def` listener that commits at once (what the broker and client cost, not a database's);
- `txn_send.baseline_send_batch.128B`: the plain batched send's messages per second;
- `txn_send.ratio`: the first over the second (target ≥ 0.30);
- `txn_send.offset_mismatch`: committed messages the real topic does not hold (must be 0)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from bench.client_produce import ProduceParams, batch_sender, create_topic, max_offsets, stats_json
from bench.common import BATCH_SIZE, PRODUCER_GROUP, CpuMeter, Options, drive, running_broker
from bench.report import BenchResult
from client import LocalTransactionState, Message, MessageExt, Producer, TransactionProducer

TARGET_RATIO = 0.30
SEND_TIMEOUT_MS = 10_000


# client_produce's shape: `one_*` are the transactions (one message each), `batch_*` the baseline's batches
TxnParams = ProduceParams


FULL = TxnParams(one_messages=60_000, one_workers=512, batch_messages=600_000, batch_workers=32, time_limit_s=10.0,
                 queues=8, body_bytes=128)
QUICK = TxnParams(one_messages=6_000, one_workers=512, batch_messages=64_000, batch_workers=32, time_limit_s=2.0,
                  queues=8, body_bytes=128)


class Commit:
    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def txn_send(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "batch_size": BATCH_SIZE}
    body = bytes(params.body_bytes)
    async with running_broker(opts) as broker:
        await create_topic(broker.address, "bench_txn_batch", params.queues)
        await create_topic(broker.address, "bench_txn", params.queues)
        async with Producer(PRODUCER_GROUP, broker.address, send_msg_timeout_ms=SEND_TIMEOUT_MS) as producer:
            call = batch_sender(producer, "bench_txn_batch", body)
            await drive(range(params.queues * 4), call, workers=params.queues, time_limit_s=10)
            baseline = await drive(range(params.batch_messages // BATCH_SIZE), call, workers=params.batch_workers,
                                   time_limit_s=params.time_limit_s)
        async with TransactionProducer("bench_txn_pg", broker.address, Commit(),
                                       send_msg_timeout_ms=SEND_TIMEOUT_MS) as txn:
            async def one(index: int) -> int:
                sent = await txn.send_message_in_transaction(Message("bench_txn", body, tags="TagA", keys=f"k{index}"))
                return 1 if sent.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE else 0
            warm = await drive(range(params.queues * 4), one, workers=params.queues, time_limit_s=10)
            meter = CpuMeter(broker)
            meter.start()
            stats = await drive(range(params.one_messages), one, workers=params.one_workers,
                                time_limit_s=params.time_limit_s)
            cpu = meter.stop()
        stored = sum(await max_offsets(broker.address, "bench_txn", params.queues))
    committed = warm.messages + stats.messages
    ratio = stats.rate / baseline.rate if baseline.rate else 0.0
    result.add(f"txn_send.{params.body_bytes}B", round(stats.rate), "msg/s")
    result.add(f"txn_send.baseline_send_batch.{params.body_bytes}B", round(baseline.rate), "msg/s")
    result.add("txn_send.ratio", round(ratio, 3), "x", ("≥", TARGET_RATIO))
    result.add("txn_send.client_cpu", cpu["client_cores"], "cores")
    result.add("txn_send.broker_cpu", cpu["broker_cores"], "cores")
    result.add("txn_send.offset_mismatch", abs(stored - committed), "msgs", ("≤", 0))
    result.details["txn_send"] = {**stats_json(stats), **cpu, "committed_with_warmup": committed,
                                  "real_topic_max_offsets_sum": stored}
    result.details["baseline_send_batch"] = stats_json(baseline)
    if stats.errors or baseline.errors or stored != committed:
        result.ok = False
        result.error = (f"txn_send: {stats.errors} failed transactions, {baseline.errors} failed batches, "
                        f"{stored} stored of {committed} committed")
