"""`cluster`: send and end-to-end consume throughput through a name server with 1 and with 3 brokers
on loopback (issue 13). On a 2-core machine this measures the overhead of routing and spreading
over brokers, not scaling: three brokers share the same two cores. Reported per run: sends/s
(`Producer.send`, 64 in flight, 128 B), consume/s (two `PushConsumer`s with an `async def`
listener draining the backlog just sent) and each broker's CPU (cores) during each phase.

Each broker gets a topic of 8 queues (1 broker: 8 queues; 3 brokers: 24), created on the broker
and registered with the name server; clients know only the name server's address. The run checks
that every acknowledged message was consumed."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.broker_proc import BrokerProcess, Usage
from bench.common import Options, drive, store_root
from bench.report import BenchResult
from broker.process import BrokerSubprocess
from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.client import ClientConfig
from protocol.bodies import TopicRouteData
from protocol.errors import TopicNotExist

TOPIC = "bench_cluster"
QUEUES_PER_BROKER = 8
OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterParams:
    messages: int
    workers: int
    time_limit_s: float


FULL = ClusterParams(messages=60_000, workers=64, time_limit_s=60.0)
QUICK = ClusterParams(messages=6_000, workers=64, time_limit_s=30.0)


def _cores(before: list[Usage], after: list[Usage]) -> list[float]:
    return [round(b.cores_since(a), 3) for a, b in zip(before, after, strict=True)]


async def _run(result: BenchResult, opts: Options, brokers_count: int, params: ClusterParams) -> None:
    label = f"{brokers_count}_broker{'s' if brokers_count > 1 else ''}"
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-", dir=store_root()) as directory:
        async with AsyncExitStack() as stack:
            namesrv = BrokerSubprocess(None, command=[sys.executable, "-m", "namesrv"])
            await stack.enter_async_context(namesrv)
            api = ClientAPI(RemotingClient())
            stack.push_async_callback(api.remoting.close)
            brokers: list[BrokerProcess] = []
            for index in range(brokers_count):
                broker = BrokerProcess(Path(directory) / f"b{index}", cpus=opts.broker_cpus, settings={
                    "broker_name": f"broker-{index}", "namesrv_addr": namesrv.address})
                brokers.append(await stack.enter_async_context(broker))
                await api.create_topic(broker.address, TOPIC, queue_nums=QUEUES_PER_BROKER)
            async with asyncio.timeout(30):
                while len((await _route(api, namesrv.address)).queue_datas) < brokers_count:
                    await asyncio.sleep(0.05)
            producer = await stack.enter_async_context(Producer("bench_cluster_pg", namesrv.address,
                                                                send_msg_timeout_ms=10_000))
            acked: set[str] = set()

            async def send(_: int) -> int:
                acked.add((await producer.send(Message(TOPIC, b"x" * 128))).uniq_keys[0])
                return 1
            before = [b.usage() for b in brokers]
            sent = await drive(range(params.messages), send, workers=params.workers, time_limit_s=params.time_limit_s)
            send_cpu = _cores(before, [b.usage() for b in brokers])

            consumed: set[str] = set()

            async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
                consumed.update(m.uniq_key or "" for m in msgs)
                return OK
            before = [b.usage() for b in brokers]
            started = time.perf_counter()
            for i in range(2):
                consumer = PushConsumer(f"bench_cluster_{label}", namesrv.address,
                                        consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                        client_config=ClientConfig(instance_name=f"bench{i}"))
                consumer.subscribe(TOPIC)
                consumer.register_listener(listener)
                await stack.enter_async_context(consumer)
            async with asyncio.timeout(params.time_limit_s):
                while not acked <= consumed:
                    await asyncio.sleep(0.01)
            consume_s = time.perf_counter() - started
            consume_cpu = _cores(before, [b.usage() for b in brokers])
    result.add(f"{label}.send", sent.rate, "msg/s")
    result.add(f"{label}.consume_e2e", len(acked) / consume_s, "msg/s")
    result.details[label] = {"acked": len(acked), "send_errors": sent.errors, "broker_cores_send": send_cpu,
                             "broker_cores_consume": consume_cpu}


async def _route(api: ClientAPI, address: str) -> TopicRouteData:
    try:
        return await api.get_route_info(address, TOPIC)
    except TopicNotExist:
        return TopicRouteData(queue_datas=[], broker_datas=[])


async def cluster(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params.update(messages=params.messages, workers=params.workers, queues_per_broker=QUEUES_PER_BROKER)
    for count in (1, 3):
        await _run(result, opts, count, params)
    result.notes.append("2 cores shared by every broker and the client: the 3-broker figures show overhead, "
                        "not scaling")
