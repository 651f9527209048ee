"""`ha_produce`: what SYNC_MASTER replication costs a `Producer` (issue 39's target: >= 60 % of a
single SYNC_FLUSH broker's send rate, batched and 64 in flight, on loopback).

Two set-ups, each on fresh stores, measured in alternation (`rounds` times each, medians reported):
- `single`: one SYNC_FLUSH broker (ASYNC_MASTER with no slave: nothing waits for a replica);
- `sync_master`: a SYNC_MASTER and one SLAVE (both SYNC_FLUSH, `in_sync_replicas_min` 2): a send is
  acknowledged once the slave has it on disk too.
Rows: `ha_produce.<send|send_batch>.128B.<single|sync_master>` (msg/s), `....sync_vs_single` (the
ratio, target >= 0.6), and the CPU per message of the master and the slave (µs; steadier than the
rates on a machine shared with other work). Every acknowledged message must be in the master's
queues (the max offsets add up) and the slave must end with the master's commit-log end."""

from __future__ import annotations

import asyncio
import socket
import statistics
import tempfile
from contextlib import AsyncExitStack
from dataclasses import asdict
from pathlib import Path

from bench.auth import AuthParams
from bench.broker_proc import BrokerProcess
from bench.client_produce import batch_sender, create_topic, max_offsets, one_sender, stats_json
from bench.common import BATCH_SIZE, PRODUCER_GROUP, CpuMeter, Options, drive, note_neighbours, store_root
from bench.report import BenchResult
from client import Producer
from protocol.errors import MQError
from protocol.message import Message

SEND_TIMEOUT_MS = 10_000
RATIO_TARGET = 0.6


HaParams = AuthParams     # the same shape as auth_cost's rows (its `connections` unused here)


# 5 alternating rounds: one broker's rate differs from the next one's by up to 20 % on this 2-core
# machine (stop 47 saw the single broker's batched sends at 146,805 and 174,702 msg/s).
FULL = HaParams(one_messages=40_000, one_workers=64, batch_messages=200_000, batch_workers=64, time_limit_s=6.0,
                rounds=5)
QUICK = HaParams(one_messages=4_000, one_workers=64, batch_messages=32_000, batch_workers=64, time_limit_s=2.0,
                 rounds=1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _until_replicated(address: str) -> None:
    """A send succeeds (the slave is connected and in sync), within 30 s."""
    async with Producer(PRODUCER_GROUP, address, send_msg_timeout_ms=SEND_TIMEOUT_MS) as producer, \
            asyncio.timeout(30):
        while True:
            try:
                await producer.send(Message(topic="bench_ha_ready", body=b"ready"))
                return
            except MQError:
                await asyncio.sleep(0.1)


async def _measure(result: BenchResult, setup: str, kind: str, round_no: int, params: HaParams,
                   opts: Options) -> tuple[float, float, float]:
    """Start the set-up on fresh stores, run one measured `kind`; (msg/s, master µs/msg, slave µs/msg)."""
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-ha-", dir=store_root()) as directory:
        root = Path(directory)
        async with AsyncExitStack() as stack:
            ha_port = _free_port()
            settings = {"broker_role": "SYNC_MASTER" if setup == "sync_master" else "ASYNC_MASTER",
                        "ha_listen_port": str(ha_port)}
            master = BrokerProcess(root / "master", settings=settings, cpus=opts.broker_cpus)
            await stack.enter_async_context(master)
            slave = None
            if setup == "sync_master":
                slave = BrokerProcess(root / "slave", settings={
                    "broker_role": "SLAVE", "broker_id": "1", "ha_master_address": f"127.0.0.1:{ha_port}"},
                    cpus=opts.broker_cpus)
                await stack.enter_async_context(slave)
            await _until_replicated(master.address)
            topic = f"bench_ha_{kind}"
            await create_topic(master.address, topic, params.queues)
            batched = kind == "send_batch"
            meters = [CpuMeter(master)] + ([CpuMeter(slave)] if slave is not None else [])
            async with Producer(PRODUCER_GROUP, master.address, send_msg_timeout_ms=SEND_TIMEOUT_MS) as producer:
                call = (batch_sender if batched else one_sender)(producer, topic, bytes(params.body_bytes))
                warm = await drive(range(params.queues * 4), call, workers=params.queues, time_limit_s=10)
                for meter in meters:
                    meter.start()
                count = params.batch_messages // BATCH_SIZE if batched else params.one_messages
                workers = params.batch_workers if batched else params.one_workers
                stats = await drive(range(count), call, workers=workers, time_limit_s=params.time_limit_s)
                cpu = [meter.stop() for meter in meters]
            label = f"ha_produce.{kind}.{params.body_bytes}B.{setup}.round{round_no}"
            acknowledged = warm.messages + stats.messages
            stored = sum(await max_offsets(master.address, topic, params.queues))
            result.details[label] = {**stats_json(stats), "master": cpu[0], "slave": cpu[1] if slave else None,
                                     "acknowledged_with_warmup": acknowledged, "broker_max_offsets_sum": stored}
            note_neighbours(result, label, cpu[0])
            if warm.errors or stats.errors or stored != acknowledged:
                result.ok = False
                result.error = (f"{label}: {warm.errors + stats.errors} failed sends ({stats.error_samples[:1]}), "
                                f"master holds {stored} of {acknowledged} acknowledged")
            rate = stats.rate
            master_us = cpu[0]["broker_cores"] * 1e6 / rate if rate else 0.0
            slave_us = cpu[1]["broker_cores"] * 1e6 / rate if slave is not None and rate else 0.0
            return rate, master_us, slave_us


async def ha_produce(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "batch_size": BATCH_SIZE, "flush": "SYNC_FLUSH"}
    result.notes.append("fresh brokers per run; single and sync_master runs alternate; medians over rounds")
    for kind in ("send", "send_batch"):
        runs: dict[str, list[tuple[float, float, float]]] = {"single": [], "sync_master": []}
        for round_no in range(params.rounds):
            for setup in ("single", "sync_master"):
                runs[setup].append(await _measure(result, setup, kind, round_no, params, opts))
        rates = {}
        for setup, samples in runs.items():
            label = f"ha_produce.{kind}.{params.body_bytes}B.{setup}"
            rates[setup] = statistics.median(s[0] for s in samples)
            result.add(label, round(rates[setup]), "msg/s")
            result.add(f"{label}.master_us_per_msg", round(statistics.median(s[1] for s in samples), 2), "µs")
            if setup == "sync_master":
                result.add(f"{label}.slave_us_per_msg", round(statistics.median(s[2] for s in samples), 2), "µs")
        result.add(f"ha_produce.{kind}.{params.body_bytes}B.sync_vs_single",
                   round(rates["sync_master"] / rates["single"], 3) if rates["single"] else 0.0, "x",
                   ("≥", RATIO_TARGET))
