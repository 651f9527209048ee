"""`wake_latency`: how fast a held pull answers when a message arrives.

One puller connection keeps a pull held (SUSPEND, suspend_timeout_ms 30000) at the end of a
one-queue topic; a sender connection sends one message every 10 ms. Latency is the held pull's
response arrival minus the instant just before the send request is written (the send ack and the
pull response race, so the ack is not waited for first). Also recorded: the send round trip, how
often the pull response beat the send ack, and a broker-side view with 1 ms resolution: client
arrival (wall clock) minus the message's store_timestamp (the broker's wall clock at put).

The floor: the round trip of a trivial request (GET_MAX_OFFSET) sent at the same 10 ms spacing.
On a VM whose idle vCPUs take long to wake, this alone can be far above 1 ms; the wake latency
minus this floor is the broker's own share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

from bench.common import PRODUCER_GROUP, CpuMeter, Options, connected, note_neighbours, pull_header, running_broker
from bench.report import BenchResult, percentile
from client.api import ClientAPI, PullResult
from protocol.headers import SendMessageRequestHeader
from protocol.model import PullStatus

TOPIC = "bench_wake"
P99_TARGET_MS = 1.0
WARMUP = 20
FLOOR_SAMPLES = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeParams:
    sends: int
    interval_ms: float
    time_limit_s: float


FULL = WakeParams(sends=2_000, interval_ms=10.0, time_limit_s=60.0)
QUICK = WakeParams(sends=200, interval_ms=10.0, time_limit_s=10.0)


@dataclass(slots=True)
class Sample:
    wake_ms: float           # pull response arrival - send start
    send_rtt_ms: float       # send ack arrival - send start
    store_to_arrival_ms: float
    pull_first: bool


async def wake_latency(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "warmup_sends": WARMUP, "suspend_timeout_ms": 30_000,
                     "flush_disk_type": "SYNC_FLUSH (default)"}
    samples: list[Sample] = []
    failures: list[str] = []
    async with running_broker(opts) as broker, connected(broker.address, 1) as pullers, \
            connected(broker.address, 1) as senders:
        address = broker.address
        await senders[0].create_topic(address, TOPIC, queue_nums=1)
        puller, sender = pullers[0], senders[0]

        async def timed_pull(queue_offset: int) -> tuple[PullResult, float, float]:
            header = pull_header(TOPIC, 0, queue_offset, max_msg_nums=32, suspend_timeout_ms=30_000)
            pulled = await puller.pull_message(address, header, timeout_ms=35_000)
            return pulled, time.perf_counter(), time.time() * 1000

        async def timed_send(index: int) -> float:
            header = SendMessageRequestHeader(producer_group=PRODUCER_GROUP, topic=TOPIC, queue_id=0,
                                              born_timestamp=0, properties={"UNIQ_KEY": f"WAKE{index:012X}"})
            await sender.send_message(address, header, b"wake", timeout_ms=10_000)
            return time.perf_counter()

        queue_offset = 0
        interval_s = params.interval_ms / 1000
        meter = CpuMeter(broker)
        meter.start()
        started = time.perf_counter()
        deadline = started + params.time_limit_s
        for index in range(WARMUP + params.sends):
            if time.perf_counter() >= deadline:
                failures.append(f"time limit reached after {index} sends")
                break
            pull_task = asyncio.create_task(timed_pull(queue_offset))
            # the pull has until the next tick to be parked by the broker
            await asyncio.sleep(max(0.0, started + (index + 1) * interval_s - time.perf_counter()))
            if pull_task.done():
                error = pull_task.exception()
                outcome = repr(error) if error else str(pull_task.result()[0].status)
                failures.append(f"pull at {queue_offset} answered before the send: {outcome}")
                queue_offset = await sender.get_max_offset(address, TOPIC, 0)
                continue
            send_started = time.perf_counter()
            send_task = asyncio.create_task(timed_send(index))
            try:
                async with asyncio.timeout(5):
                    pulled, arrived, arrived_wall_ms = await pull_task
                    acked = await send_task
            except Exception as exc:
                pull_task.cancel()
                send_task.cancel()
                failures.append(f"send {index}: {type(exc).__name__}: {exc}")
                if len(failures) > 20:
                    break
                queue_offset = await sender.get_max_offset(address, TOPIC, 0)
                continue
            if pulled.status is not PullStatus.FOUND or not pulled.messages:
                failures.append(f"send {index}: held pull answered {pulled.status}")
            else:
                queue_offset = pulled.next_begin_offset
                if index >= WARMUP:
                    samples.append(Sample((arrived - send_started) * 1000, (acked - send_started) * 1000,
                                          arrived_wall_ms - pulled.messages[-1].store_timestamp,
                                          arrived <= acked))
        cpu = meter.stop()
        note_neighbours(result, "wake_latency", cpu)
        floor = await _rtt_floor(sender, address, min(params.sends, FLOOR_SAMPLES), interval_s,
                                 params.time_limit_s)
    _report(result, samples, failures, params, floor)
    result.details["cpu"] = cpu


async def _rtt_floor(api: ClientAPI, address: str, count: int, interval_s: float,
                     time_limit_s: float) -> list[float]:
    """Round trips (ms) of GET_MAX_OFFSET, one every `interval_s`, sorted."""
    rtts: list[float] = []
    deadline = time.perf_counter() + time_limit_s
    for _ in range(count):
        if time.perf_counter() >= deadline:
            break
        await asyncio.sleep(interval_s)
        started = time.perf_counter()
        await api.get_max_offset(address, TOPIC, 0, timeout_ms=5_000)
        rtts.append((time.perf_counter() - started) * 1000)
    return sorted(rtts)


def _report(result: BenchResult, samples: list[Sample], failures: list[str], params: WakeParams,
            floor: list[float]) -> None:
    wake = sorted(s.wake_ms for s in samples)
    rtt = sorted(s.send_rtt_ms for s in samples)
    store = sorted(s.store_to_arrival_ms for s in samples)
    result.add("wake_latency.p50", round(percentile(wake, 0.5), 3), "ms")
    result.add("wake_latency.p99", round(percentile(wake, 0.99), 3), "ms", ("≤", P99_TARGET_MS))
    result.add("wake_latency.p999", round(percentile(wake, 0.999), 3), "ms")
    result.add("wake_latency.samples", len(samples), "sends", ("≥", params.sends))
    result.add("wake_latency.rtt_floor.p50", round(percentile(floor, 0.5), 3), "ms")
    result.add("wake_latency.rtt_floor.p99", round(percentile(floor, 0.99), 3), "ms")
    result.details = {"rtt_floor_ms": _quantiles(floor),
        "wake_ms": _quantiles(wake), "send_rtt_ms": _quantiles(rtt),
        "broker_store_to_client_arrival_ms_1ms_resolution": _quantiles(store),
        "pull_response_before_send_ack_fraction": round(sum(s.pull_first for s in samples) / len(samples), 4)
        if samples else None,
        "failures": failures[:20], "failure_count": len(failures)}
    if failures:
        result.notes.append(f"{len(failures)} iterations failed, e.g. {failures[0]}")
    if len(samples) < params.sends:
        result.ok = False
        result.error = f"only {len(samples)} of {params.sends} wake-ups measured"


def _quantiles(ordered: list[float]) -> dict[str, float]:
    return {name: round(percentile(ordered, q), 3)
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999), ("max", 1.0))}
