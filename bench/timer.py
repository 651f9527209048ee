"""`timer`: timer messages (RocketMQ 5's timer wheel, issue 38) against plain sends in one run.

1. Plain sends: `count` one-at-a-time sends (64 in flight) of 128-byte messages: the baseline rate.
2. Scheduling: `count` timer sends (TIMER_DELIVER_MS) the same way, all due at one instant a few
   seconds after the sending is expected to end (estimated from the plain rate); the broker's RSS
   before and after (the timer store keeps no per-message object: the wheel is a mapped file whose
   touched pages only count, the log is read from disk when due).
3. Delivery: the real topic's max offsets are polled until all are delivered; then the first and
   last message of each queue are pulled: the rate is `count` over the span of their store
   timestamps (when the broker put them in the topic; target >= 50,000 msg/s), and the earliest
   one's lateness is reported too (broker-side times: a poll's own latency while the broker is busy
   delivering does not count).

Memory: RSS (what the OS reports: it includes the pages of the mapped commit log and consume
queues a send touches, so it grows with plain sends too) and RssAnon (/proc/<pid>/status: the
process's own heap, where per-message Python objects would show).

Both phases use one broker subprocess with ASYNC_FLUSH (the send path compared, not the disk)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.broker_proc import BrokerProcess
from bench.common import Options, connected, drive, pull_header, store_root
from bench.report import BenchResult
from client.api import ClientAPI
from protocol.headers import SendMessageRequestHeader

DELIVERY_TARGET_MSG_S = 50_000.0
PLAIN_TOPIC = "bench_plain"
TIMER_TOPIC = "bench_timer"
QUEUES = 8
MIB = 1 << 20


def rss_anon_bytes(pid: int) -> int:
    """RssAnon of process `pid` (Linux), 0 when /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _edge_timestamps(api: ClientAPI, address: str) -> tuple[int, int]:
    """(earliest, latest) store_timestamp among the first and last message of each queue."""
    stamps: list[int] = []
    for queue_id in range(QUEUES):
        last = await api.get_max_offset(address, TIMER_TOPIC, queue_id) - 1
        for queue_offset in (0, last):
            pulled = await api.pull_message(address, pull_header(TIMER_TOPIC, queue_id, queue_offset,
                                                                 max_msg_nums=1), 10_000)
            stamps += [m.store_timestamp for m in pulled.messages[:1]]
    return min(stamps), max(stamps)


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
            rss_start, anon_start = broker.usage().rss_bytes, rss_anon_bytes(broker.pid)
            sent_plain = await drive(range(count), send_plain, workers=64, time_limit_s=params.time_limit_s)
            rss_before, anon_before = broker.usage().rss_bytes, rss_anon_bytes(broker.pid)
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
            rss_after, anon_after = broker.usage().rss_bytes, rss_anon_bytes(broker.pid)
            if sent_timer.messages != count:
                raise RuntimeError(f"only {sent_timer.messages} of {count} timer messages stored: "
                                   f"{sent_timer.error_samples}")
            api = clients[0]

            async def delivered() -> int:
                return sum([await api.get_max_offset(address, TIMER_TOPIC, q) for q in range(QUEUES)])
            early = await delivered()
            deadline = time.perf_counter() + params.time_limit_s
            total = early
            while total < count and time.perf_counter() < deadline:
                await asyncio.sleep(0.05)
                total = await delivered()
            rss_delivered = broker.usage().rss_bytes
            if total < count:
                raise RuntimeError(f"only {total} of {count} timer messages delivered in {params.time_limit_s:.0f} s")
            first_ms, last_ms = await _edge_timestamps(api, address)
    if first_ms < due_ms:
        raise RuntimeError(f"a timer message was delivered {due_ms - first_ms} ms before its time")
    span_s = (last_ms - first_ms) / 1000
    rate = count / span_s if span_s > 0 else float("nan")
    result.add("plain_send", sent_plain.rate, "msg/s")
    result.add("timer_send", sent_timer.rate, "msg/s")
    result.add("timer_send_vs_plain", sent_timer.rate / sent_plain.rate * 100, "%")
    result.add("timer_delivery", rate, "msg/s", ("≥", DELIVERY_TARGET_MSG_S))
    result.add("delivery_vs_plain_send", rate / sent_plain.rate * 100, "%")
    result.add("first_delivery_late", first_ms - due_ms, "ms")
    result.add("rss_before_scheduling", rss_before / MIB, "MiB")
    result.add("rss_after_scheduling", rss_after / MIB, "MiB")
    result.add("rss_growth_scheduling", (rss_after - rss_before) / MIB, "MiB")
    result.add("rss_growth_plain_sends", (rss_before - rss_start) / MIB, "MiB")
    result.add("anon_growth_scheduling", (anon_after - anon_before) / MIB, "MiB")
    result.add("anon_growth_plain_sends", (anon_before - anon_start) / MIB, "MiB")
    result.details.update(due_ms=due_ms, scheduled_at_ms=scheduled_at_ms, delivered_before_due=early,
                          rss_after_delivery_mib=round(rss_delivered / MIB, 1), delivery_span_s=span_s)
    if scheduled_at_ms > due_ms:
        result.notes.append(f"scheduling ended {scheduled_at_ms - due_ms} ms after the due time: the delivery "
                            f"rate then overlaps the sends")
