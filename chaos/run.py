"""The chaos run: a broker and consumer processes under a seeded fault schedule, producers in this
process, then the checker (`chaos.checker`) over every acknowledged send and every delivery.

Traffic: `producers` tasks send unique keys `c:<task>:<n>` to topic `chaos_c` (concurrent group
`chaos_cg`, 1 % of messages failing once), and 8 shard tasks send `o:<shard>:<seq>` to `chaos_o`
in sequence, each to the queue of its shard (orderly group `chaos_og`). A send is retried with the
same key until acknowledged; only acknowledged keys are expected. After the last cycle the
producers stop and the run waits (bounded) until every acknowledged key was delivered."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.broker_proc import free_port
from broker.process import BrokerSubprocess, signal_and_wait
from chaos.checker import GroupResult, check_group
from chaos.hostile import DISK_SETTINGS, HOSTILE_FAULTS, apply_hostile, small_store_disk
from chaos.measure import FaultWindow, Recorder
from chaos.schedule import FAULTS, FaultStep, fault_schedule
from client import Message, Producer, SelectMessageQueueByHash
from conf.client import ClientConfig
from protocol.errors import MQError

log = logging.getLogger(__name__)

CONCURRENT_TOPIC, ORDERLY_TOPIC = "chaos_c", "chaos_o"
SHARDS = 8
BROKER_SETTINGS = {"graceful_shutdown_timeout_ms": "2000"}


@dataclass
class ChaosReport:
    seed: int
    steps: list[FaultStep]
    concurrent: GroupResult
    orderly: GroupResult
    elapsed_s: float
    windows: list[FaultWindow] = field(default_factory=list)     # per step: the fault and what followed
    hostile: dict[int, str] = field(default_factory=dict)         # cycle -> what its hostile fault reported
    hostile_lost: int = 0                                         # what the hostile faults made unreachable
    faults: int = field(init=False)

    def __post_init__(self) -> None:
        self.faults = len(self.steps)

    @property
    def passed(self) -> bool:
        return (self.concurrent.lost == 0 and self.orderly.lost == 0 and self.orderly.reorderings == 0
                and self.hostile_lost == 0)

    def lines(self) -> list[str]:
        out = [f"chaos seed {self.seed}: {len(self.steps)} cycles, {self.faults} faults, {self.elapsed_s:.0f} s"]
        for step, window in zip(self.steps, self.windows, strict=False):
            out.append(f"  {step.describe()}: {window.describe()}"
                       + (f"; {self.hostile[step.cycle]}" if step.cycle in self.hostile else ""))
        for name, group in (("concurrent", self.concurrent), ("orderly", self.orderly)):
            out.append(f"  {name:10s} acknowledged {group.acknowledged}, deliveries {group.delivered}, "
                       f"lost {group.lost}, duplicates {group.duplicates}, reorderings {group.reorderings}"
                       + (f" (lost e.g. {list(group.lost_examples)})" if group.lost else ""))
        out.append("  PASS" if self.passed else "  FAIL")
        return out


class ConsumerProcess:
    def __init__(self, index: int, address: str, group: str, topic: str, outfile: Path, mode: str) -> None:
        self.index, self._args = index, [address, group, topic, str(outfile), mode]
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "chaos.consumer", *self._args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        assert self.process.stdout is not None
        async with asyncio.timeout(30):
            line = await self.process.stdout.readline()
        if not line.startswith(b"READY"):
            raise RuntimeError(f"consumer {self.index} did not start (exit {await self.process.wait()})")

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        await signal_and_wait(process, sig, 15)


class Traffic:
    """Producer tasks; `acked` holds every acknowledged key per topic."""

    def __init__(self, address: str, producers: int, recorder: Recorder) -> None:
        self._recorder = recorder
        self._producer = Producer("chaos_pg", address, retry_times_when_send_failed=2, send_msg_timeout_ms=2_000,
                                  client_config=ClientConfig(heartbeat_interval_ms=1_000))
        self._count = producers
        self.acked: dict[str, list[str]] = {CONCURRENT_TOPIC: [], ORDERLY_TOPIC: []}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self._producer.start()
        self._tasks = [asyncio.create_task(self._concurrent(i)) for i in range(self._count)]
        self._tasks += [asyncio.create_task(self._orderly(shard)) for shard in range(SHARDS)]

    async def _send(self, topic: str, key: str, shard: int | None) -> None:
        message = Message(topic=topic, body=key.encode(), keys=key)
        started = time.monotonic()
        while not self._stop.is_set():
            try:
                if shard is None:
                    await self._producer.send(message)
                else:
                    await self._producer.send(message, SelectMessageQueueByHash(), shard)
            except (MQError, OSError) as exc:
                log.debug("send %s failed, retrying: %s", key, exc)
                await asyncio.sleep(0.1)
                continue
            self.acked[topic].append(key)
            self._recorder.sent(started)
            return

    async def _concurrent(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            await self._send(CONCURRENT_TOPIC, f"c:{index}:{n}", None)
            n += 1

    async def _orderly(self, shard: int) -> None:
        seq = 0
        while not self._stop.is_set():
            await self._send(ORDERLY_TOPIC, f"o:{shard}:{seq}", shard)
            await asyncio.sleep(0.005)
            seq += 1

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._producer.shutdown()


def read_keys(files: list[Path]) -> list[str]:
    """Every delivery in the consumers' files (`<key> <time_ns>` lines), in time order."""
    stamped: list[tuple[int, str]] = []
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                key, _, stamp = line.partition(" ")
                if key and stamp.isdigit():          # a torn last line of a killed process is skipped
                    stamped.append((int(stamp), key))
    stamped.sort()
    return [key for _, key in stamped]


async def run_chaos(workdir: Path, *, cycles: int, seed: int, consumers_per_group: int = 2, producers: int = 2,
                    run_s: tuple[float, float] = (2.0, 5.0), drain_timeout_s: float = 60.0,
                    echo: bool = True, kinds: Sequence[str] = FAULTS) -> ChaosReport:
    """A chaos run of `cycles` faults drawn from `kinds` (the module docstring). With `disk-fill`
    among them, the store goes on a tmpfs of its own (root only; otherwise the kind is left out,
    saying so)."""
    say = print if echo else log.info
    kinds = list(kinds)
    with small_store_disk(workdir / "disk") if "disk-fill" in kinds else contextlib.nullcontext() as disk:
        if "disk-fill" in kinds and disk is None:
            say("chaos: disk-fill left out: mounting a tmpfs for the store needs root")
            kinds.remove("disk-fill")
        return await _run_chaos(workdir, disk, cycles=cycles, seed=seed, consumers_per_group=consumers_per_group,
                                producers=producers, run_s=run_s, drain_timeout_s=drain_timeout_s, say=say,
                                kinds=kinds)


async def _run_chaos(workdir: Path, disk: Path | None, *, cycles: int, seed: int, consumers_per_group: int,
                     producers: int, run_s: tuple[float, float], drain_timeout_s: float, say: Callable[[str], None],
                     kinds: Sequence[str]) -> ChaosReport:
    started = time.monotonic()
    steps = fault_schedule(seed, cycles, 2 * consumers_per_group, run_s=run_s, kinds=kinds)
    replay = f"--seed {seed}" + ("" if list(kinds) == list(FAULTS) else f" --kinds {','.join(kinds)}")
    say(f"chaos seed {seed} (replay with {replay}):")
    for step in steps:
        say("  " + step.describe())
    port = free_port()
    settings = BROKER_SETTINGS if disk is None else {**BROKER_SETTINGS, **DISK_SETTINGS}
    broker = BrokerSubprocess((disk or workdir) / "store", listen_port=port, settings=settings)
    await broker.start()
    address = broker.address
    outputs = {"concurrent": workdir / "concurrent", "orderly": workdir / "orderly"}
    for directory in outputs.values():
        directory.mkdir(parents=True, exist_ok=True)
    consumers = [ConsumerProcess(i, address, "chaos_cg", CONCURRENT_TOPIC, outputs["concurrent"] / f"{i}.txt",
                                 "concurrent") for i in range(consumers_per_group)]
    consumers += [ConsumerProcess(i + consumers_per_group, address, "chaos_og", ORDERLY_TOPIC,
                                  outputs["orderly"] / f"{i}.txt", "orderly") for i in range(consumers_per_group)]
    recorder = Recorder()
    sampler = asyncio.create_task(recorder.run(lambda: broker.pid if broker.alive() else None))
    traffic = Traffic(address, producers, recorder)
    fault_times: list[float] = []
    hostile: dict[int, str] = {}
    hostile_lost = 0
    try:
        await asyncio.gather(*(c.start() for c in consumers))
        await traffic.start()
        for step in steps:
            await asyncio.sleep(step.run_s)
            say(f"  applying {step.describe()} (acknowledged so far: "
                f"{sum(len(v) for v in traffic.acked.values())})")
            fault_times.append(time.monotonic())
            if step.fault in HOSTILE_FAULTS:
                outcome = await apply_hostile(step, broker, disk, group="chaos_cg", topic=CONCURRENT_TOPIC)
                hostile[step.cycle], hostile_lost = outcome.detail, hostile_lost + outcome.lost
            else:
                await _apply(step, broker, consumers)
        await asyncio.sleep(1.0)
        fault_times.append(time.monotonic())
        await traffic.stop()
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline:
            delivered_c = set(read_keys(sorted(outputs["concurrent"].iterdir())))
            delivered_o = set(read_keys(sorted(outputs["orderly"].iterdir())))
            if (delivered_c.issuperset(traffic.acked[CONCURRENT_TOPIC])
                    and delivered_o.issuperset(traffic.acked[ORDERLY_TOPIC])):
                break
            await asyncio.sleep(0.5)
    finally:
        sampler.cancel()
        for consumer in consumers:
            await consumer.stop()
        await broker.stop()
    report = ChaosReport(
        seed, steps,
        check_group(traffic.acked[CONCURRENT_TOPIC], read_keys(sorted(outputs["concurrent"].iterdir()))),
        check_group(traffic.acked[ORDERLY_TOPIC], read_keys(sorted(outputs["orderly"].iterdir())), orderly=True),
        time.monotonic() - started,
        [recorder.window(start, end) for start, end in itertools.pairwise(fault_times)], hostile, hostile_lost)
    for line in report.lines():
        say(line)
    return report


async def _apply(step: FaultStep, broker: BrokerSubprocess, consumers: list[ConsumerProcess]) -> None:
    if step.fault == "broker-kill":
        broker.kill()
        await broker.stop()
        await broker.start()
    elif step.fault == "broker-stop":
        os.kill(broker.pid, signal.SIGSTOP)
        await asyncio.sleep(step.pause_s)
        os.kill(broker.pid, signal.SIGCONT)
    elif step.fault == "consumer-kill":
        consumer = consumers[step.target]
        await consumer.stop(signal.SIGKILL)
        await consumer.start()
    else:   # clean-restart
        for consumer in consumers:
            await consumer.stop()
        await broker.stop()
        await broker.start()
        await asyncio.gather(*(c.start() for c in consumers))
