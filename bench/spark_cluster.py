"""Spark on a cluster (issue 41): a name server and two brokers (subprocesses), a `local[2]` session.

- `spark_cluster_read`: batch reads (Spark's `noop` sink) of a 1,000,000-message backlog (128 B)
  spread over TWO brokers (500,000 each, 8 queues each: a topic created on a cluster, as mqadmin
  `updateTopic -c` creates it), on ONE broker with as many queues (16), and on one broker with 8
  queues, all through the name server, each read once to warm up and then interleaved `ROUNDS`
  times; medians in rows/s. Target: the two-broker read at least as fast as both one-broker
  reads of the same run: the one of as many queues (so as many Spark tasks) and the one of 8
  queues (Spark's cost per read task, ~30 ms of a `local[2]` session's time here, makes 16 tasks
  slower than 8 for the same rows).
- `spark_sink_dedup`: `df.write.format("rocketq")` of 200,000 rows (128 B bodies, 2 partitions)
  to a topic on both brokers, whose `store.dedup_window_ms` is on, with the sink's `dedup` option
  on and off, interleaved; medians in rows/s and the brokers' CPU per row (µs, more stable than
  throughput on a shared machine). Target: dedup costs at most 20 % of the throughput.

On a 2-core machine the brokers, Spark's JVM and its Python workers share the cores: these are
the overheads of spreading and of dedup, not scaling."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.broker_proc import BrokerProcess
from bench.common import BATCH_SIZE, Options, batch_header, drive, store_root, synthetic_batches
from bench.report import BenchResult
from broker.process import BrokerSubprocess
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.errors import TopicNotExist

ONE, TWO, SINK = "bench_spark_one", "bench_spark_two", "bench_spark_sink"
ONE_8 = "bench_spark_one_8"
QUEUES = 8                  # per broker of a topic on the cluster
QUEUE_NUMS = {ONE: 2 * QUEUES}      # the one-broker topic compared with TWO: as many queues as TWO has
ROUNDS = 7
DEDUP_COST_TARGET = 0.20


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    messages: int
    sink_rows: int


FULL = Params(messages=1_000_000, sink_rows=200_000)
QUICK = Params(messages=100_000, sink_rows=20_000)


class Cluster:
    """Name server + broker-a, broker-b (ASYNC_FLUSH, dedup window on), in `stack`."""

    def __init__(self, stack: AsyncExitStack, directory: Path, opts: Options) -> None:
        self._stack, self._directory, self._opts = stack, directory, opts
        self.namesrv = ""
        self.brokers: list[BrokerProcess] = []
        self.api = ClientAPI(RemotingClient())

    async def start(self) -> None:
        namesrv = BrokerSubprocess(None, command=[sys.executable, "-m", "namesrv"])
        await self._stack.enter_async_context(namesrv)
        self.namesrv = namesrv.address
        self._stack.push_async_callback(self.api.remoting.close)
        for name in ("broker-a", "broker-b"):
            broker = BrokerProcess(self._directory / name, cpus=self._opts.broker_cpus, settings={
                "broker_name": name, "namesrv_addr": self.namesrv, "register_name_server_period_ms": "500",
                "store.flush_disk_type": "ASYNC_FLUSH", "store.dedup_window_ms": "600000"})
            self.brokers.append(await self._stack.enter_async_context(broker))

    async def topic(self, topic: str, brokers: list[BrokerProcess]) -> None:
        for broker in brokers:
            await self.api.create_topic(broker.address, topic, queue_nums=QUEUE_NUMS.get(topic, QUEUES))
        async with asyncio.timeout(60):
            while await self._routed(topic) < len(brokers):
                await asyncio.sleep(0.05)      # a bounded poll: brokers register topics with the name server

    async def _routed(self, topic: str) -> int:
        try:
            return len((await self.api.get_route_info(self.namesrv, topic)).queue_datas)
        except TopicNotExist:
            return 0

    async def fill(self, topic: str, broker: BrokerProcess, messages: int) -> int:
        bodies = synthetic_batches(topic, 128, BATCH_SIZE)
        headers = [batch_header(topic, q) for q in range(QUEUE_NUMS.get(topic, QUEUES))]

        async def call(index: int) -> int:
            await self.api.send_batch(broker.address, headers[index % len(headers)], bodies[index % len(bodies)],
                                      timeout_ms=10_000)
            return BATCH_SIZE

        return (await drive(range(messages // BATCH_SIZE), call, workers=32, time_limit_s=300)).messages

    def cpu_s(self) -> float:
        return sum(b.usage().cpu_s for b in self.brokers)


def _session() -> Any:
    from client.spark.session import local_session

    return local_session("rocketq-bench-cluster", conf={"spark.driver.memory": "2g"})


def _read(spark: Any, endpoint: str, topic: str) -> float:
    from client.spark.session import activate

    activate(spark)             # (a thread of asyncio's pool: Spark finds `rocketq` through it)
    started = time.perf_counter()
    (spark.read.format("rocketq").option("endpoints", endpoint).option("topic", topic).load()
     .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - started


async def spark_cluster_read(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "rounds": ROUNDS}
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-", dir=store_root()) as directory:
        async with AsyncExitStack() as stack:
            cluster = Cluster(stack, Path(directory), opts)
            await cluster.start()
            a, b = cluster.brokers
            topics = (ONE, TWO, ONE_8)
            for topic, brokers in zip(topics, ([a], [a, b], [a]), strict=True):
                await cluster.topic(topic, brokers)
            sent = [await cluster.fill(ONE, a, params.messages),
                    sum([await cluster.fill(TWO, broker, params.messages // 2) for broker in (a, b)]),
                    await cluster.fill(ONE_8, a, params.messages)]
            spark = await asyncio.to_thread(_session)
            for topic in topics:        # starts the Python workers; each broker's read path once
                await asyncio.to_thread(_read, spark, cluster.namesrv, topic)
            times: dict[str, list[float]] = {topic: [] for topic in topics}
            for _ in range(ROUNDS):
                for topic in topics:
                    times[topic].append(await asyncio.to_thread(_read, spark, cluster.namesrv, topic))
            counts = [await asyncio.to_thread(_count, spark, cluster.namesrv, topic) for topic in topics]
    one_rate, two_rate, one_8_rate = (n / statistics.median(times[t]) for n, t in zip(sent, topics, strict=True))
    result.add("spark.cluster_read.1_broker", round(one_rate), "rows/s")
    result.add("spark.cluster_read.1_broker_8_queues", round(one_8_rate), "rows/s")
    result.add("spark.cluster_read.2_brokers", round(two_rate), "rows/s", ("≥", round(max(one_rate, one_8_rate))))
    result.details["read"] = {"sent": sent, "counted": counts, "queues": [2 * QUEUES, 2 * QUEUES, QUEUES],
                              "elapsed_s": {t: [round(s, 2) for s in v] for t, v in times.items()}}
    if counts != sent:
        result.ok, result.error = False, f"read {counts} rows of {sent} sent"


def _count(spark: Any, endpoint: str, topic: str) -> int:
    from client.spark.session import activate

    activate(spark)
    return int(spark.read.format("rocketq").option("endpoints", endpoint).option("topic", topic).load().count())


def _write(spark: Any, endpoint: str, rows: int, dedup: bool) -> float:
    from client.spark.session import activate

    activate(spark)
    df = spark.range(rows, numPartitions=2).selectExpr("cast(repeat('x', 128) as binary) as body")
    started = time.perf_counter()
    (df.write.format("rocketq").option("endpoints", endpoint).option("topic", SINK)
     .option("dedup", str(dedup).lower()).mode("append").save())
    return time.perf_counter() - started


async def spark_sink_dedup(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "rounds": ROUNDS}
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}     # (elapsed s, broker CPU s)
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-", dir=store_root()) as directory:
        async with AsyncExitStack() as stack:
            cluster = Cluster(stack, Path(directory), opts)
            await cluster.start()
            await cluster.topic(SINK, cluster.brokers)
            spark = await asyncio.to_thread(_session)
            await asyncio.to_thread(_write, spark, cluster.namesrv, 1_000, True)       # starts the workers
            for _ in range(ROUNDS):
                for dedup in (False, True):
                    cpu_before = cluster.cpu_s()
                    elapsed_s = await asyncio.to_thread(_write, spark, cluster.namesrv, params.sink_rows, dedup)
                    runs[dedup].append((elapsed_s, cluster.cpu_s() - cpu_before))
            stored = sum([await cluster.api.get_max_offset(b.address, SINK, q)
                          for b in cluster.brokers for q in range(QUEUES)])
    rate = {d: params.sink_rows / statistics.median(e for e, _ in runs[d]) for d in runs}
    cpu_us = {d: statistics.median(c for _, c in runs[d]) / params.sink_rows * 1e6 for d in runs}
    cost = 1 - rate[True] / rate[False]
    result.add("spark.sink.dedup_off", round(rate[False]), "rows/s")
    result.add("spark.sink.dedup_on", round(rate[True]), "rows/s", ("≥", round(rate[False] * (1 - DEDUP_COST_TARGET))))
    result.add("spark.sink.dedup_cost", round(100 * cost, 1), "%", ("≤", 100 * DEDUP_COST_TARGET))
    result.add("spark.sink.broker_cpu_per_row.dedup_off", round(cpu_us[False], 2), "µs")
    result.add("spark.sink.broker_cpu_per_row.dedup_on", round(cpu_us[True], 2), "µs")
    result.details["sink"] = {"runs": {str(d): [(round(e, 2), round(c, 2)) for e, c in v] for d, v in runs.items()},
                              "stored": stored}
    expected = 1_000 + 2 * ROUNDS * params.sink_rows      # each write is a new job: new UNIQ_KEYs
    if stored != expected:
        result.ok, result.error = False, f"the brokers stored {stored} rows, expected {expected}"
