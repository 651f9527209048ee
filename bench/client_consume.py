"""`client_consume`: end-to-end consumption through the public `PushConsumer`, one broker (ASYNC_FLUSH
for the whole benchmark: the fill and the live producers), topics of 8 queues, 128 B messages.

- backlog: `backlog_messages` are sent first (`Producer.send_batch` of 32), then for each listener
  kind (sync `def`, async `async def`) and each consumer count (1, and 4 members of one group in this
  process splitting the 8 queues) a fresh group reads the topic with CONSUME_FROM_FIRST_OFFSET. The
  rate is the messages over the time from the first consumer's `start()` until every (queue_id,
  queue_offset) below the broker's max offsets was handed to the listener;
- live: the consumers run while one `Producer` sends batches of 32 at a fixed rate for
  `live_seconds`; reported: the consume rate over that window, how long the consumers needed after
  the last send to catch up, and the end-to-end latency (listener call time - born_timestamp, ms;
  both clocks are this process's wall clock, 1 ms resolution).

The listeners are "no-op" but for one `list.extend` per call recording (queue_id << 32 | queue_offset)
of each message (and the latency in live runs): that is how missing and duplicate messages are found.

With RQ_BENCH_PYSPY_CLIENT=DIR in the environment, `py-spy record --threads` samples this process
(busy threads only) during each 1-consumer backlog run into DIR/client-<run>.txt (investigation only:
py-spy takes CPU from the bench on a small machine)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.broker_proc import BrokerProcess, stop_profiler
from bench.client_produce import batch_sender, create_topic, max_offsets, stats_json
from bench.common import BATCH_SIZE, PRODUCER_GROUP, CpuMeter, Options, drive, note_neighbours, running_broker
from bench.report import BenchResult, percentile
from client import ConsumeConcurrentlyStatus, MessageExt, Producer, PushConsumer
from client.consumer.listener import MessageListener

BACKLOG_TARGET_MSG_S = 150_000.0   # 1 consumer, from the backlog
LISTENER_KINDS = ("sync", "async")
S = TypeVar("S")
BACKLOG_TOPIC = "bench_cc_backlog"
CONSUME_SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeParams:
    backlog_messages: int
    queues: int
    body_bytes: int
    consumer_counts: tuple[int, ...]
    consume_message_batch_max_size: int
    pull_batch_size: int
    fill_workers: int
    fill_time_limit_s: float
    consume_time_limit_s: float          # a backlog run, or a live run's catch-up, gives up after this
    live_seconds: float
    live_rate_msg_s: int
    live_senders: int


FULL = ConsumeParams(backlog_messages=400_000, queues=8, body_bytes=128, consumer_counts=(1, 4),
                     consume_message_batch_max_size=1, pull_batch_size=32, fill_workers=32,
                     fill_time_limit_s=60, consume_time_limit_s=60, live_seconds=10, live_rate_msg_s=25_000,
                     live_senders=8)
QUICK = ConsumeParams(backlog_messages=40_000, queues=8, body_bytes=128, consumer_counts=(1, 4),
                      consume_message_batch_max_size=1, pull_batch_size=32, fill_workers=32,
                      fill_time_limit_s=15, consume_time_limit_s=15, live_seconds=2, live_rate_msg_s=15_000,
                      live_senders=8)


@dataclass(slots=True)
class Tally:
    """What the listeners saw. `seen` holds (queue_id << 32 | queue_offset) per message delivered;
    `latencies_ms` consume time - born_timestamp when `track_latency`. Written from listener threads
    with one `list.extend` each (atomic under the GIL)."""

    track_latency: bool = False
    seen: list[int] = field(default_factory=list)
    latencies_ms: list[int] = field(default_factory=list)

    def record(self, msgs: list[MessageExt]) -> None:
        self.seen.extend([(m.queue_id << 32) | m.queue_offset for m in msgs])
        if self.track_latency:
            now_ms = time.time_ns() // 1_000_000
            self.latencies_ms.extend([now_ms - m.born_timestamp for m in msgs])

    def listener(self, kind: str) -> MessageListener:
        """A concurrent listener that records what it gets: a sync `def` for `kind` "sync", else an
        `async def`."""
        return self.answering(CONSUME_SUCCESS, kind)

    def answering(self, status: S, kind: str) -> Callable[[list[MessageExt], Any], S | Awaitable[S]]:
        """A listener (concurrent or orderly, by `status`'s type) that records what it gets and
        answers `status`: a sync `def` for `kind` "sync", else an `async def`."""
        def sync_listener(msgs: list[MessageExt], ctx: Any) -> S:
            self.record(msgs)
            return status

        async def async_listener(msgs: list[MessageExt], ctx: Any) -> S:
            self.record(msgs)
            return status

        return sync_listener if kind == "sync" else async_listener


@dataclass(frozen=True, slots=True)
class Check:
    expected: int
    delivered: int
    unique: int
    missing: int
    duplicates: int
    unexpected: int


def expected_keys(offsets: Sequence[int]) -> set[int]:
    return {(q << 32) | o for q, max_offset in enumerate(offsets) for o in range(max_offset)}


def check(tally: Tally, expected: set[int]) -> Check:
    seen = list(tally.seen)
    unique = set(seen)
    return Check(expected=len(expected), delivered=len(seen), unique=len(unique),
                 missing=len(expected - unique), duplicates=len(seen) - len(unique),
                 unexpected=len(unique - expected))


async def wait_all_consumed(tally: Tally, expected: set[int], deadline: float) -> float | None:
    """perf_counter() when every expected key was seen (polled every 2 ms), None at `deadline`."""
    checked_at = 0
    while time.perf_counter() < deadline:
        delivered = len(tally.seen)
        if delivered >= len(expected) and delivered != checked_at:
            checked_at, seen_at = delivered, time.perf_counter()   # the check itself is not on the clock
            if expected <= set(tally.seen[:delivered]):
                return seen_at
            await asyncio.sleep(0.05)   # duplicates filled the count: look again less often
        await asyncio.sleep(0.002)
    return None


@contextlib.asynccontextmanager
async def consumers(address: str, group: str, topic: str, count: int, listener: MessageListener,
                    params: ConsumeParams) -> AsyncIterator[list[PushConsumer]]:
    """`count` started members of `group` (started concurrently), shut down on exit."""
    members = []
    for _ in range(count):
        consumer = PushConsumer(group, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                consume_message_batch_max_size=params.consume_message_batch_max_size,
                                pull_batch_size=params.pull_batch_size)
        consumer.subscribe(topic, "*")
        consumer.register_listener(listener)
        members.append(consumer)
    try:
        await asyncio.gather(*(c.start() for c in members))
        yield members
    finally:
        await asyncio.gather(*(c.shutdown() for c in members), return_exceptions=True)


async def wait_split(members: list[PushConsumer], topic: str, queues: int, timeout_s: float = 30.0) -> None:
    """Until the members hold all `queues` queues of `topic` between them, none twice; raises TimeoutError."""
    async with asyncio.timeout(timeout_s):
        while True:
            held = [mq for c in members for mq in c.assigned_queues(topic)]
            if len(held) == queues == len(set(held)) and all(c.assigned_queues(topic) for c in members):
                return
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def client_profile(label: str) -> AsyncIterator[None]:
    """py-spy on this process while the block runs, when RQ_BENCH_PYSPY_CLIENT is set."""
    directory = os.environ.get("RQ_BENCH_PYSPY_CLIENT")
    if not directory:
        yield
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    output = Path(directory) / f"client-{label}.txt"
    profiler = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(os.getpid()), "--rate", "250",
        "--nonblocking", "--threads", "--format", "raw", "--output", str(output),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    await asyncio.sleep(0.5)   # py-spy needs a moment to attach
    try:
        yield
    finally:
        await stop_profiler(profiler)


def _fail(result: BenchResult, message: str) -> None:
    result.ok = False
    result.error = message if result.error is None else result.error


def _record_check(result: BenchResult, label: str, outcome: Check) -> None:
    result.add(f"{label}.missing", outcome.missing, "msgs", ("≤", 0))
    result.add(f"{label}.duplicates", outcome.duplicates, "msgs")
    if outcome.missing or outcome.unexpected:
        _fail(result, f"{label}: {outcome.missing} of {outcome.expected} messages never consumed, "
                      f"{outcome.unexpected} unexpected")


async def _fill(result: BenchResult, address: str, params: ConsumeParams) -> list[int]:
    """Send the backlog; returns the broker's max offset per queue (checked against the acks)."""
    await create_topic(address, BACKLOG_TOPIC, params.queues)
    async with Producer(PRODUCER_GROUP, address, send_msg_timeout_ms=10_000) as producer:
        call = batch_sender(producer, BACKLOG_TOPIC, bytes(params.body_bytes))
        stats = await drive(range(params.backlog_messages // BATCH_SIZE), call, workers=params.fill_workers,
                            time_limit_s=params.fill_time_limit_s)
    offsets = await max_offsets(address, BACKLOG_TOPIC, params.queues)
    result.add("client_consume.fill.send_batch.128B.ASYNC_FLUSH", round(stats.rate), "msg/s")
    result.details["fill"] = {**stats_json(stats), "broker_max_offsets": offsets, "flush": "ASYNC_FLUSH"}
    if stats.errors or sum(offsets) != stats.messages:
        _fail(result, f"fill: {stats.errors} errors, broker holds {sum(offsets)} of {stats.messages} acknowledged")
    if stats.timed_out:
        result.notes.append(f"fill stopped by its time limit after {stats.messages} messages")
    return offsets


async def _backlog_run(result: BenchResult, broker: BrokerProcess, params: ConsumeParams, kind: str,
                       count: int, expected: set[int]) -> None:
    label = f"client_consume.backlog.{kind}.x{count}"
    tally = Tally()
    meter = CpuMeter(broker)
    async with client_profile(f"backlog-{kind}-x{count}") if count == 1 else contextlib.nullcontext():
        meter.start()
        started = time.perf_counter()
        async with consumers(broker.address, f"bench_cc_backlog_{kind}_{count}", BACKLOG_TOPIC, count,
                             tally.listener(kind), params) as members:
            done_at = await wait_all_consumed(tally, expected, started + params.consume_time_limit_s)
            cpu = meter.stop()
            assigned = [len(c.assigned_queues(BACKLOG_TOPIC)) for c in members]
    elapsed = (done_at or time.perf_counter()) - started
    rate = len(expected) / elapsed if done_at is not None else float("nan")
    result.add(label, round(rate) if rate == rate else rate, "msg/s",
               ("≥", BACKLOG_TARGET_MSG_S) if count == 1 else None)
    result.add(f"{label}.client_cpu", cpu["client_cores"], "cores")
    result.add(f"{label}.broker_cpu", cpu["broker_cores"], "cores")
    outcome = check(tally, expected)
    _record_check(result, label, outcome)
    result.details[label] = {**asdict(outcome), "elapsed_s": round(elapsed, 3), "completed": done_at is not None,
                             **cpu, "queues_per_consumer_at_end": assigned}
    note_neighbours(result, label, cpu)


async def _paced_sends(producer: Producer, topic: str, body: bytes, params: ConsumeParams) -> tuple[int, int]:
    """`live_senders` tasks sending batches of 32 on a fixed schedule totalling `live_rate_msg_s`
    for `live_seconds` (a late task sends at once, no burst to catch up beyond one batch);
    returns (messages acknowledged, failed sends)."""
    interval_s = params.live_senders * BATCH_SIZE / params.live_rate_msg_s
    started = time.perf_counter()
    deadline = started + params.live_seconds
    call = batch_sender(producer, topic, body)
    totals = [0, 0]

    async def sender(index: int) -> None:
        next_at = started + index * interval_s / params.live_senders
        while next_at < deadline:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            try:
                done = await call(index)   # not `+= await`: that reads the total before awaiting
                totals[0] += done
            except Exception:
                totals[1] += 1
            next_at = max(next_at + interval_s, time.perf_counter() - interval_s)

    async with asyncio.timeout(params.live_seconds + 60):
        await asyncio.gather(*(sender(i) for i in range(params.live_senders)))
    return totals[0], totals[1]


async def _live_run(result: BenchResult, broker: BrokerProcess, params: ConsumeParams, kind: str,
                    count: int) -> None:
    label = f"client_consume.live.{kind}.x{count}"
    topic = f"bench_cc_live_{kind}_{count}"
    address = broker.address
    await create_topic(address, topic, params.queues)
    tally = Tally(track_latency=True)
    async with consumers(address, f"bench_cc_live_{kind}_{count}", topic, count, tally.listener(kind),
                         params) as members:
        await wait_split(members, topic, params.queues)
        async with Producer(PRODUCER_GROUP, address, send_msg_timeout_ms=10_000) as producer:
            meter = CpuMeter(broker)
            meter.start()
            started = time.perf_counter()
            sent, failed = await _paced_sends(producer, topic, bytes(params.body_bytes), params)
            sent_until = time.perf_counter()
            consumed_in_window = len(tally.seen)
            cpu = meter.stop()
        offsets = await max_offsets(address, topic, params.queues)
        expected = expected_keys(offsets)
        done_at = await wait_all_consumed(tally, expected, time.perf_counter() + params.consume_time_limit_s)
    window_s = sent_until - started
    latencies = sorted(tally.latencies_ms)
    result.add(label, round(consumed_in_window / window_s), "msg/s")
    result.add(f"{label}.sent", round(sent / window_s), "msg/s")
    result.add(f"{label}.latency_p50", percentile(latencies, 0.5), "ms")
    result.add(f"{label}.latency_p99", percentile(latencies, 0.99), "ms")
    result.add(f"{label}.client_cpu", cpu["client_cores"], "cores")
    outcome = check(tally, expected)
    _record_check(result, label, outcome)
    catch_up_ms = round(((done_at or time.perf_counter()) - sent_until) * 1000, 1)
    result.details[label] = {**asdict(outcome), "sent": sent, "failed_sends": failed, "window_s": round(window_s, 3),
                             "consumed_in_window": consumed_in_window, "catch_up_ms": catch_up_ms,
                             "completed": done_at is not None, "broker_max_offsets_sum": sum(offsets),
                             "latency_max_ms": latencies[-1] if latencies else None, **cpu}
    note_neighbours(result, label, cpu)
    if sent < 0.95 * params.live_rate_msg_s * window_s:
        result.notes.append(f"{label}: the producer reached {sent / window_s:,.0f} of {params.live_rate_msg_s:,} msg/s "
                            "(this process is saturated): the latency includes queueing")
    if failed or sum(offsets) != sent:
        _fail(result, f"{label}: {failed} failed sends, broker holds {sum(offsets)} of {sent} acknowledged")


async def client_consume(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    details: dict[str, Any] = {**asdict(params), "batch_size": BATCH_SIZE, "flush_disk_type": "ASYNC_FLUSH"}
    result.params = details
    result.notes += [
        "one ASYNC_FLUSH broker for the whole benchmark (backlog fill and live producers)",
        "all consumers (and, in live runs, the producer) share this one bench process and event loop",
        "listeners record each message's queue offset (one list.extend per call) to find gaps and duplicates",
    ]
    async with running_broker(opts, {"store.flush_disk_type": "ASYNC_FLUSH"}) as broker:
        offsets = await _fill(result, broker.address, params)
        expected = expected_keys(offsets)
        await asyncio.sleep(1.0)   # let the fill's reput and flush settle
        for kind in LISTENER_KINDS:
            for count in params.consumer_counts:
                await _backlog_run(result, broker, params, kind, count, expected)
        for kind in LISTENER_KINDS:
            for count in params.consumer_counts:
                await _live_run(result, broker, params, kind, count)
