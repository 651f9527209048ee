"""SQL92 filter benchmarks (issue 8).

`sql92_eval`: evaluations per second of a compiled 3-predicate expression
("TAGS IN ('paid', 'refund') AND amount > 100 AND region = 'eu'") over messages of 10 properties
each (1,000 distinct property maps cycled, about a third matching), in this process, one core.
Also reported, informational: the same through the broker's `SqlMessageFilter` after reading the
properties out of a stored payload as a pull does (`sql92_eval.from_stored_payload`), and the
compile time of the expression.

`filtered_wake`: a held pull with an SQL92 filter on a one-queue topic; each round sends one
message that does not match (the pull must stay held: a wake-up here is a failure) and then one
that does; latency is the held pull's answer minus the instant before the matching send is
written, as `wake_latency` measures it. Target p99 <= 5 ms. A GET_MAX_OFFSET on the puller's
connection after the pull is the barrier that shows the pull is parked (the broker runs a
connection's requests in arrival order and parks a pull before its first await), and one after
the non-matching send's ack shows that send did not wake it."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from dataclasses import asdict, dataclass

import msgpack

from bench.common import PRODUCER_GROUP, CpuMeter, Options, connected, note_neighbours, pull_header, running_broker
from bench.report import BenchResult, percentile
from broker.filter.filter_manager import FilterManager
from broker.filter.sql92 import compile_expression
from broker.store.record import payload_properties
from client.api import PullResult
from protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from protocol.model import PullStatus

EXPRESSION = "TAGS IN ('paid', 'refund') AND amount > 100 AND region = 'eu'"
EVAL_TARGET_PER_S = 300_000.0
WAKE_P99_TARGET_MS = 5.0
TOPIC = "bench_sql_wake"


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalParams:
    evaluations: int
    stored_evaluations: int


EVAL_FULL = EvalParams(evaluations=2_000_000, stored_evaluations=300_000)
EVAL_QUICK = EvalParams(evaluations=300_000, stored_evaluations=50_000)


def property_maps(count: int, seed: int = 8) -> list[dict[str, str]]:
    """`count` maps of 10 properties (TAGS, KEYS, UNIQ_KEY, amount, region and 5 more)."""
    rng = random.Random(seed)
    maps = []
    for i in range(count):
        maps.append({"TAGS": rng.choice(("paid", "refund", "created", "shipped")), "KEYS": f"order-{i}",
                     "UNIQ_KEY": f"{rng.getrandbits(64):016X}{i:016X}", "amount": str(rng.randint(0, 300)),
                     "region": rng.choice(("eu", "us", "asia")), "currency": rng.choice(("EUR", "USD")),
                     "customer": f"c{rng.randint(1, 10_000)}", "channel": rng.choice(("web", "app", "shop")),
                     "weight": f"{rng.uniform(0, 20):.2f}", "priority": str(rng.randint(0, 9))})
    return maps


async def sql92_eval(result: BenchResult, opts: Options) -> None:
    params = EVAL_QUICK if opts.quick else EVAL_FULL
    result.params = {**asdict(params), "expression": EXPRESSION, "properties_per_message": 10,
                     "distinct_messages": 1_000}
    started = time.perf_counter()
    for _ in range(100):
        compile_expression(EXPRESSION)
    result.add("sql92_eval.compile", round((time.perf_counter() - started) / 100 * 1e6, 1), "us")
    expression = compile_expression(EXPRESSION)
    maps = property_maps(1_000)
    evaluate = expression.evaluate
    expected = sum(evaluate(m) is True for m in maps)
    rounds = params.evaluations // len(maps)
    matched = 0
    started = time.perf_counter()
    for _ in range(rounds):
        for properties in maps:
            if evaluate(properties) is True:
                matched += 1
    elapsed = time.perf_counter() - started
    result.add("sql92_eval.evaluations", round(rounds * len(maps) / elapsed), "evals/s", ("≥", EVAL_TARGET_PER_S))
    # as a pull pays it: properties read out of a stored payload, then the broker's filter
    payloads = [memoryview(msgpack.packb(["t", 0, i, i * 200, 0, 0, 0, "127.0.0.1:1", 0, "127.0.0.1:2", 0, m,
                                          b"x" * 128], use_bin_type=True)) for i, m in enumerate(maps)]
    match = FilterManager(sql92_enabled=True).sql_filter("g", "t", 1, EXPRESSION).match_by_commit_log
    rounds = max(params.stored_evaluations // len(payloads), 1)
    stored_matched = 0
    started = time.perf_counter()
    for _ in range(rounds):
        for payload in payloads:
            stored_matched += match(payload_properties(payload))
    elapsed = time.perf_counter() - started
    result.add("sql92_eval.from_stored_payload", round(rounds * len(payloads) / elapsed), "evals/s")
    result.details = {"match_fraction": round(expected / len(maps), 3)}
    if matched != expected * (params.evaluations // len(maps)) or stored_matched != expected * rounds:
        result.ok = False
        result.error = "evaluation results differ between rounds"


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeParams:
    rounds: int
    interval_ms: float
    time_limit_s: float


WAKE_FULL = WakeParams(rounds=1_000, interval_ms=10.0, time_limit_s=90.0)
WAKE_QUICK = WakeParams(rounds=150, interval_ms=10.0, time_limit_s=20.0)
WARMUP = 20


async def filtered_wake(result: BenchResult, opts: Options) -> None:
    params = WAKE_QUICK if opts.quick else WAKE_FULL
    result.params = {**asdict(params), "warmup_rounds": WARMUP, "expression": "region = 'eu' AND amount > 100",
                     "flush_disk_type": "SYNC_FLUSH (default)"}
    latencies: list[float] = []
    failures: list[str] = []
    false_wakes = 0
    async with running_broker(opts) as broker, connected(broker.address, 1) as pullers, \
            connected(broker.address, 1) as senders:
        address, puller, sender = broker.address, pullers[0], senders[0]
        await sender.create_topic(address, TOPIC, queue_nums=1)

        async def held_pull(queue_offset: int) -> tuple[PullResult, float]:
            header: PullMessageRequestHeader = dataclasses.replace(
                pull_header(TOPIC, 0, queue_offset, suspend_timeout_ms=30_000),
                subscription="region = 'eu' AND amount > 100", expression_type="SQL92")
            pulled = await puller.pull_message(address, header, timeout_ms=35_000)
            return pulled, time.perf_counter()

        async def send(region: str, amount: int) -> None:
            header = SendMessageRequestHeader(producer_group=PRODUCER_GROUP, topic=TOPIC, queue_id=0,
                                              born_timestamp=0, properties={"region": region, "amount": str(amount)})
            await sender.send_message(address, header, b"wake", timeout_ms=10_000)

        queue_offset = 0
        interval_s = params.interval_ms / 1000
        meter = CpuMeter(broker)
        meter.start()
        started = time.perf_counter()
        for index in range(WARMUP + params.rounds):
            if time.perf_counter() - started > params.time_limit_s:
                failures.append(f"time limit reached after {index} rounds")
                break
            await asyncio.sleep(interval_s)
            pull_task = asyncio.create_task(held_pull(queue_offset))
            await asyncio.sleep(0)                         # the pull request is written first
            await puller.get_max_offset(address, TOPIC, 0, timeout_ms=10_000)     # parked
            await send("us", 500)                          # does not match
            await puller.get_max_offset(address, TOPIC, 0, timeout_ms=10_000)     # a wake-up would be first
            if pull_task.done():
                false_wakes += 1
                failures.append(f"round {index}: woken by a non-matching message")
                pulled, _ = await pull_task
                queue_offset = pulled.next_begin_offset
                continue
            send_started = time.perf_counter()
            await send("eu", 500)
            try:
                async with asyncio.timeout(5):
                    pulled, arrived = await pull_task
            except TimeoutError:
                failures.append(f"round {index}: not woken within 5 s")
                queue_offset = await sender.get_max_offset(address, TOPIC, 0)
                continue
            if pulled.status is not PullStatus.FOUND or len(pulled.messages) != 1:
                failures.append(f"round {index}: {pulled.status} with {len(pulled.messages)} messages")
            elif index >= WARMUP:
                latencies.append((arrived - send_started) * 1000)
            queue_offset = pulled.next_begin_offset
        cpu = meter.stop()
        note_neighbours(result, "filtered_wake", cpu)
    latencies.sort()
    result.add("filtered_wake.p50", round(percentile(latencies, 0.5), 3), "ms")
    result.add("filtered_wake.p99", round(percentile(latencies, 0.99), 3), "ms", ("≤", WAKE_P99_TARGET_MS))
    result.add("filtered_wake.false_wakes", false_wakes, "wakes", ("≤", 0))
    result.add("filtered_wake.samples", len(latencies), "rounds")
    result.details = {"cpu": cpu, "failures": failures[:20], "failure_count": len(failures),
                      "max_ms": round(latencies[-1], 3) if latencies else None}
    if false_wakes or len(latencies) < params.rounds * 0.95:
        result.ok = False
        result.error = f"{false_wakes} false wake-ups, {len(latencies)} of {params.rounds} rounds measured"
