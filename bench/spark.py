"""Spark source benchmarks (issue 11), on a `local[2]` SparkSession against a broker subprocess.

- `spark_batch_read`: a batch read of a 1,000,000-message backlog (128 B bodies, 8 queues) through
  `spark.read.format("rocketq")`, materialised by Spark's `noop` sink, in rows/s. Python workers
  are started by a small warm-up read first, so the figure is the steady read, not JVM start-up.
- `spark_stream_latency`: a streaming query with a 1 s processing-time trigger while a producer
  sends 20 messages/s; per message, the time from its store timestamp to the end of the
  micro-batch that read it (foreachBatch on the driver), p50 / p99, and the micro-batches' own
  durations. The 1 s trigger bounds the wait for a batch to start, so about 0.5 s of the p50 is
  the trigger by design.

Spark calls block, so they run in a thread while the event loop keeps draining the broker's log."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import BATCH_SIZE, Options, batch_header, broker_with_clients, drive, synthetic_batches
from bench.report import BenchResult
from client.api import ClientAPI
from protocol.headers import SendMessageRequestHeader

BATCH_READ_TARGET_ROWS_S = 200_000.0
TOPIC = "bench_spark"
STREAM_TOPIC = "bench_spark_stream"


@dataclass(frozen=True, slots=True, kw_only=True)
class SparkParams:
    messages: int
    queues: int
    stream_seconds: float
    stream_rate_msg_s: float


FULL = SparkParams(messages=1_000_000, queues=8, stream_seconds=20.0, stream_rate_msg_s=20.0)
QUICK = SparkParams(messages=100_000, queues=8, stream_seconds=8.0, stream_rate_msg_s=20.0)
BROKER_SETTINGS = {"store.flush_disk_type": "ASYNC_FLUSH"}


def _session() -> Any:
    from client.spark.session import local_session

    return local_session("rocketq-bench", conf={"spark.driver.memory": "2g"})


async def _fill(api: ClientAPI, address: str, params: SparkParams) -> int:
    await api.create_topic(address, TOPIC, queue_nums=params.queues)
    bodies = synthetic_batches(TOPIC, 128, BATCH_SIZE)
    headers = [batch_header(TOPIC, q) for q in range(params.queues)]

    async def call(index: int) -> int:
        await api.send_batch(address, headers[index % params.queues], bodies[index % len(bodies)], timeout_ms=10_000)
        return BATCH_SIZE

    stats = await drive(range(params.messages // BATCH_SIZE), call, workers=32, time_limit_s=300)
    return stats.messages


def _read(spark: Any, address: str, ending: str) -> float:
    started = time.perf_counter()
    (spark.read.format("rocketq").option("endpoints", address).option("topic", TOPIC)
     .option("endingOffsets", ending).load().write.format("noop").mode("overwrite").save())
    return time.perf_counter() - started


async def spark_batch_read(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = asdict(params)
    async with broker_with_clients(opts, 1, BROKER_SETTINGS) as (broker, clients):
        sent = await _fill(clients[0], broker.address, params)
        spark = await asyncio.to_thread(_session)
        await asyncio.to_thread(_read, spark, broker.address, '{"0": 1000}')     # starts the Python workers
        elapsed_s = await asyncio.to_thread(_read, spark, broker.address, "latest")
        count = await asyncio.to_thread(lambda: spark.read.format("rocketq").option("endpoints", broker.address)
                                        .option("topic", TOPIC).load().count())
    result.add("spark.batch_read.128B", round(sent / elapsed_s), "rows/s", ("≥", BATCH_READ_TARGET_ROWS_S))
    result.details["batch_read"] = {"messages": sent, "elapsed_s": round(elapsed_s, 3), "counted": count}
    if count != sent:
        result.ok, result.error = False, f"read {count} rows of {sent} sent"


class _Latencies:
    """Per-message store → batch-end latencies (ms), collected by foreachBatch on the driver."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        stored = [row.store_timestamp.timestamp() for row in df.select("store_timestamp").collect()]
        now = time.time()
        with self.lock:
            self.ms.extend((now - s) * 1000 for s in stored)


async def _produce(api: ClientAPI, address: str, params: SparkParams) -> int:
    sent, interval_s = 0, 1 / params.stream_rate_msg_s
    deadline = time.monotonic() + params.stream_seconds
    while time.monotonic() < deadline:
        header = SendMessageRequestHeader(producer_group="bench_pg", topic=STREAM_TOPIC, queue_id=sent % 4,
                                          properties={}, born_timestamp=time.time_ns() // 1_000_000)
        await api.send_message(address, header, b"x" * 128)
        sent += 1
        await asyncio.sleep(interval_s)   # the offered load's pacing, not a synchronisation
    return sent


async def spark_stream_latency(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = asdict(params)
    latencies = _Latencies()
    async with broker_with_clients(opts, 1, BROKER_SETTINGS) as (broker, clients):
        api, address = clients[0], broker.address
        await api.create_topic(address, STREAM_TOPIC, queue_nums=4)
        spark = await asyncio.to_thread(_session)

        def start() -> Any:
            return (spark.readStream.format("rocketq").option("endpoints", address).option("topic", STREAM_TOPIC)
                    .option("startingOffsets", "earliest").load().writeStream.foreachBatch(latencies)
                    .trigger(processingTime="1 second").start())

        query = await asyncio.to_thread(start)
        try:
            sent = await _produce(api, address, params)
            deadline = time.monotonic() + 30
            while len(latencies.ms) < sent and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            await asyncio.to_thread(query.stop)
    durations = [p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"]]
    received = sorted(latencies.ms)
    if not received:
        result.ok, result.error = False, "the streaming query read nothing"
        return
    result.add("spark.stream.latency.p50", round(statistics.median(received)), "ms")
    result.add("spark.stream.latency.p99", round(received[int(0.99 * (len(received) - 1))]), "ms")
    result.add("spark.stream.batch_duration.p50", round(statistics.median(durations)) if durations else float("nan"),
               "ms")
    result.details["stream"] = {"sent": sent, "received": len(received), "batches": len(durations)}
    if len(received) != sent:
        result.ok, result.error = False, f"the query read {len(received)} of {sent} messages"
