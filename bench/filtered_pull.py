"""`filtered_pull`: how fast the 1 % of a 1,000,000-message backlog that matches an SQL92
subscription reaches its consumer, against a `*` pull of the same number of messages.

A group registers (HEART_BEAT) the subscription "TAGS IN ('paid', 'refund') AND bucket = 42" on
an 8-queue topic, then the backlog is written with batched sends on an ASYNC_FLUSH broker: 128 B
messages with 6 properties, `bucket` = message number % 100, so 1 % match. Then, one pull loop per
queue, all queues at once, with `ClientAPI.pull_message` (every message decoded, as a consumer):
- `filtered_pull.star`: a `*` pull from offset 0 of as many messages per queue as match there;
- `filtered_pull.sql92`: the group's pulls (registered subscription, no SUBSCRIPTION flag) from
  offset 0 to each queue's end, checking every message delivered matches and none is missing;
- `filtered_pull.sql92_not_indexed`: an expression no group registered ("... bucket = 42.0", the
  same messages) carried in the pull (SUBSCRIPTION flag), so every message's properties are read
  and evaluated, 800 consume-queue entries per pull at most (informational).
The target: the matching messages arrive at >= 50 % of the `*` rate. The registered subscription
meets it because the broker records, as each message arrives, which registered expressions it
matches (`broker.filter.match_index`), so its pulls read only matching messages; a subscription
registered after the backlog was written gets the not-indexed rate for that backlog."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import asdict, dataclass

from bench.common import BATCH_SIZE, Clients, Options, broker_with_clients, cpu_measured, pull_header, send_batches
from bench.report import BenchResult
from protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData
from protocol.headers import PullMessageRequestHeader
from protocol.message import Message, encode_batch_body
from protocol.model import PullStatus

TOPIC = "bench_filtered"
GROUP = "bench_sql_cg"
EXPRESSION = "TAGS IN ('paid', 'refund') AND bucket = 42"
NOT_INDEXED = "TAGS IN ('paid', 'refund') AND bucket = 42.0"
RATIO_TARGET = 0.5
DISTINCT_BODIES = 100          # 100 bodies of 32: every bucket exactly 32 times per cycle


@dataclass(frozen=True, slots=True, kw_only=True)
class FilteredParams:
    messages: int
    queues: int
    fill_time_limit_s: float
    pull_time_limit_s: float


FULL = FilteredParams(messages=1_000_000, queues=8, fill_time_limit_s=120, pull_time_limit_s=120)
QUICK = FilteredParams(messages=100_000, queues=8, fill_time_limit_s=20, pull_time_limit_s=30)


def _bodies() -> tuple[list[bytes], list[int]]:
    """Pre-encoded batch bodies and how many messages of each match."""
    bodies, matches = [], []
    for b in range(DISTINCT_BODIES):
        messages = []
        for i in range(BATCH_SIZE):
            number = b * BATCH_SIZE + i
            messages.append(Message(TOPIC, bytes([number % 251]) * 128, tags=("paid", "refund")[number % 2],
                                    keys=f"k{number}", properties={
                                        "UNIQ_KEY": f"F{number:031X}", "bucket": str(number % 100),
                                        "region": ("eu", "us", "asia")[number % 3], "amount": str(number % 500)}))
        bodies.append(encode_batch_body(messages))
        matches.append(sum(1 for m in messages if m.properties and m.properties["bucket"] == "42"))
    return bodies, matches


@dataclass(slots=True)
class Loop:
    queue_id: int
    until_offset: int         # pull until next_begin_offset reaches it ...
    until_count: int          # ... or this many messages came (the `*` pull)
    queue_offset: int = 0
    received: int = 0
    pulls: int = 0
    wrong: int = 0


async def _run_loops(clients: Clients, address: str, loops: list[Loop], header_of: PullHeader,
                     time_limit_s: float) -> float:
    deadline = time.perf_counter() + time_limit_s

    async def one(loop: Loop) -> None:
        api = clients[loop.queue_id]
        while (loop.queue_offset < loop.until_offset and loop.received < loop.until_count
               and time.perf_counter() < deadline):
            pulled = await api.pull_message(address, header_of(loop.queue_id, loop.queue_offset), timeout_ms=30_000)
            loop.pulls += 1
            if pulled.status is PullStatus.FOUND:
                loop.received += len(pulled.messages)
                loop.wrong += sum(1 for m in pulled.messages if m.properties.get("bucket") != "42")
            loop.queue_offset = pulled.next_begin_offset

    started = time.perf_counter()
    await asyncio.gather(*(one(loop) for loop in loops))
    return time.perf_counter() - started


class PullHeader:
    """Builds a pull header for (queue_id, queue_offset)."""

    def __init__(self, template: PullMessageRequestHeader) -> None:
        self._template = template

    def __call__(self, queue_id: int, queue_offset: int) -> PullMessageRequestHeader:
        return dataclasses.replace(self._template, queue_id=queue_id, queue_offset=queue_offset)


async def filtered_pull(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "expression": EXPRESSION, "match_fraction": 0.01, "body_bytes": 128}
    bodies, body_matches = _bodies()
    settings = {"store.flush_disk_type": "ASYNC_FLUSH"}
    async with broker_with_clients(opts, params.queues, settings) as (broker, clients):
        address = broker.address
        await clients[0].create_topic(address, TOPIC, queue_nums=params.queues)
        sub = SubscriptionData(topic=TOPIC, sub_string=EXPRESSION, expression_type="SQL92", sub_version=1)
        await clients[0].send_heartbeat(address, HeartbeatData(client_id="bench-filter", consumer_data_set=[
            ConsumerData(group_name=GROUP, consume_type="PULL", subscription_data_set=[sub])]))
        sent, matching = [0] * params.queues, [0] * params.queues

        def count(index: int, queue_id: int, messages: int) -> None:
            sent[queue_id] += messages
            matching[queue_id] += body_matches[index % DISTINCT_BODIES]

        stats = await send_batches(clients, address, TOPIC, params.queues, bodies, params.messages // BATCH_SIZE,
                                   workers=32, time_limit_s=params.fill_time_limit_s, on_sent=count)
        result.details["fill"] = {"messages": stats.messages, "elapsed_s": round(stats.elapsed_s, 3),
                                  "errors": stats.errors, "matching": sum(matching)}
        await asyncio.sleep(1.0)    # let the fill's reput and flush settle

        rates: dict[str, float] = {}
        star = PullHeader(pull_header(TOPIC, 0, 0, max_msg_nums=32))
        registered = PullHeader(dataclasses.replace(
            pull_header(TOPIC, 0, 0, max_msg_nums=32, group=GROUP), sys_flag=0, sub_version=1, subscription=None,
            expression_type=None))
        carried = PullHeader(dataclasses.replace(pull_header(TOPIC, 0, 0, max_msg_nums=32, group="bench_sql_other"),
                                                 subscription=NOT_INDEXED, expression_type="SQL92"))
        for name, header_of, counts in (("filtered_pull.star", star, True),
                                        ("filtered_pull.sql92", registered, False),
                                        ("filtered_pull.sql92_not_indexed", carried, False)):
            loops = [Loop(q, sent[q], matching[q] if counts else sent[q]) for q in range(params.queues)]
            with cpu_measured(result, broker, name) as cpu:
                elapsed = await _run_loops(clients, address, loops, header_of, params.pull_time_limit_s)
            received = sum(loop.received for loop in loops)
            rates[name] = received / elapsed
            result.details[name] = {"received": received, "elapsed_s": round(elapsed, 3), **cpu,
                                    "pulls": sum(loop.pulls for loop in loops)}
            if not counts:
                result.details[name]["not_matching_delivered"] = sum(loop.wrong for loop in loops)
            if not counts and (received != sum(matching) or any(loop.wrong for loop in loops)):
                result.ok = False
                result.error = (f"{name}: received {received} messages, {sum(matching)} match, "
                                f"{sum(loop.wrong for loop in loops)} delivered that do not")
            if counts and received < sum(matching):
                result.ok = False
                result.error = f"{name}: received {received} of {sum(matching)}"
    result.add("filtered_pull.star", round(rates["filtered_pull.star"]), "msg/s")
    result.add("filtered_pull.sql92", round(rates["filtered_pull.sql92"]), "msg/s")
    result.add("filtered_pull.sql92_vs_star", round(rates["filtered_pull.sql92"] / rates["filtered_pull.star"], 3),
               "ratio", ("≥", RATIO_TARGET))
    result.add("filtered_pull.sql92_not_indexed", round(rates["filtered_pull.sql92_not_indexed"]), "msg/s")
