"""`timer`: timer messages (RocketMQ 5's timer wheel, issue 38) against plain sends in one run.

1. Plain sends: `count` one-at-a-time sends (64 in flight) of 128-byte messages: the baseline rate.
2. Scheduling: `count` timer sends (TIMER_DELIVER_MS) the same way, all due at one instant a few
   seconds after the sending is expected to end (estimated from the plain rate); the broker's RSS
   before and after (the timer store keeps no per-message object: the wheel is a mapped file whose
   touched pages only count, the log is read from disk when due).
3. Delivery: from the due instant, the real topic's max offsets are polled every 10 ms; the rate
   is `count` over the span from the first delivered message seen to the last (target >= 50,000
   msg/s); the first one's lateness is reported too.

Both phases use one broker subprocess with ASYNC_FLUSH (the send path compared, not the disk)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.broker_proc import BrokerProcess
from bench.common import Options, connected, drive, store_root
from bench.report import BenchResult
from protocol.headers import SendMessageRequestHeader

DELIVERY_TARGET_MSG_S = 50_000.0
PLAIN_TOPIC = "bench_plain"
TIMER_TOPIC = "bench_timer"
QUEUES = 8
MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerParams:
    count: int
    time_limit_s: float


FULL = TimerParams(count=1_000_000, time_limit_s=600.0)
QUICK = TimerParams(count=50_000, time_limit_s=120.0)


async def timer(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    count = params.count
    result.params.update(messages=count)
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-", dir=store_root()) as directory:
        broker = BrokerProcess(Path(directory) / "store", cpus=opts.broker_cpus,
                               settings={"store.flush_disk_type": "ASYNC_FLUSH"})
        async with broker, connected(broker.address, 2) as clients:
            address = broker.address
            for topic in (PLAIN_TOPIC, TIMER_TOPIC):
                await clients[0].create_topic(address, topic, queue_nums=QUEUES)
            plain = [SendMessageRequestHeader(producer_group="bench_pg", topic=PLAIN_TOPIC, queue_id=q,
                                              properties={"TAGS": "t"}) for q in range(QUEUES)]

            async def send_plain(index: int) -> int:
                await clients[index % 2].send_message(address, plain[index % QUEUES], b"x" * 128, timeout_ms=10_000)
                return 1
            rss_start = broker.usage().rss_bytes
            sent_plain = await drive(range(count), send_plain, workers=64, time_limit_s=params.time_limit_s)
            rss_before = broker.usage().rss_bytes
            expected_s = count / max(sent_plain.rate * 0.5, 1.0)
            due_ms = int(time.time() * 1000 + (expected_s + 5) * 1000)
            timed = [SendMessageRequestHeader(producer_group="bench_pg", topic=TIMER_TOPIC, queue_id=q,
                                              properties={"TAGS": "t", "TIMER_DELIVER_MS": str(due_ms)})
                     for q in range(QUEUES)]

            async def send_timer(index: int) -> int:
                await clients[index % 2].send_message(address, timed[index % QUEUES], b"x" * 128, timeout_ms=10_000)
                return 1
            sent_timer = await drive(range(count), send_timer, workers=64, time_limit_s=params.time_limit_s)
            scheduled_at_ms = int(time.time() * 1000)
            rss_after = broker.usage().rss_bytes
            if sent_timer.messages != count:
                raise RuntimeError(f"only {sent_timer.messages} of {count} timer messages stored: "
                                   f"{sent_timer.error_samples}")
            api = clients[0]

            async def delivered() -> int:
                return sum([await api.get_max_offset(address, TIMER_TOPIC, q) for q in range(QUEUES)])
            early = await delivered()
            first_seen_ms = last_ms = 0.0
            deadline = time.perf_counter() + params.time_limit_s
            total = early
            while total < count and time.perf_counter() < deadline:
                await asyncio.sleep(0.01)
                total = await delivered()
                now_ms = time.time() * 1000
                if total and not first_seen_ms:
                    first_seen_ms = now_ms
                last_ms = now_ms
            rss_delivered = broker.usage().rss_bytes
        if total < count:
            raise RuntimeError(f"only {total} of {count} timer messages delivered in {params.time_limit_s:.0f} s")
    span_s = (last_ms - first_seen_ms) / 1000
    rate = count / span_s if span_s > 0 else float("nan")
    result.add("plain_send", sent_plain.rate, "msg/s")
    result.add("timer_send", sent_timer.rate, "msg/s")
    result.add("timer_send_vs_plain", sent_timer.rate / sent_plain.rate * 100, "%")
    result.add("timer_delivery", rate, "msg/s", ("≥", DELIVERY_TARGET_MSG_S))
    result.add("delivery_vs_plain_send", rate / sent_plain.rate * 100, "%")
    result.add("first_delivery_late", first_seen_ms - due_ms, "ms")
    result.add("rss_before_scheduling", rss_before / MIB, "MiB")
    result.add("rss_after_scheduling", rss_after / MIB, "MiB")
    result.add("rss_growth_scheduling", (rss_after - rss_before) / MIB, "MiB")
    result.add("rss_growth_plain_sends", (rss_before - rss_start) / MIB, "MiB")
    result.details.update(due_ms=due_ms, scheduled_at_ms=scheduled_at_ms, delivered_before_due=early,
                          rss_after_delivery_mib=round(rss_delivered / MIB, 1), delivery_span_s=span_s)
    if scheduled_at_ms > due_ms:
        result.notes.append(f"scheduling ended {scheduled_at_ms - due_ms} ms after the due time: the delivery "
                            f"rate then overlaps the sends")
