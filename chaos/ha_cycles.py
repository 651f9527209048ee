"""HA cycles (`make chaos` after the broker cycles; `python -m chaos --ha-cycles N`): a controller
and a master + slave (`chaos.ha_cluster`), one producer sending unique keys in sequence, each to
queue `n % QUEUES`, while faults hit the replica set:

- `kill_master`: SIGKILL the master; the controller elects the slave; the old master restarts and
  rejoins as slave (truncating what the new epoch never had);
- `kill_slave`: SIGKILL the slave, restart it once the controller has dropped it from the
  SyncStateSet (SYNC_MASTER sends wait, then go on);
- `stop_master`: SIGSTOP the master past the lease (an election), then SIGCONT: it learns the new
  epoch and steps down;
- `cut_replication`: SIGSTOP the slave past `ha_housekeeping_timeout_ms`, until the master has
  closed the replication connection and the controller dropped the slave from the SyncStateSet,
  then SIGCONT: the slave reconnects.

Each cycle begins once the controller names both in the SyncStateSet; waiting for the set to shrink
after a slave's fault first keeps that from reading the set from before the fault (a master killed
while its slave is out of the set is, rightly, not replaced).

Then every queue is read from the master: each acknowledged body must be there exactly once and in
acknowledgement order (lost / duplicated / reordered, as the broker cycles' report), both stores
pass `check_store`, and their commit logs are equal up to the shorter one's end. A failed run (or
RQ_HA_DEBUG=1) logs the last lines of every process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker.store.check import check_store
from chaos.ha_cluster import TOPIC, HACluster
from protocol.headers import PullMessageRequestHeader
from protocol.model import PullStatus

log = logging.getLogger(__name__)
QUEUES = 2
HA_FAULTS = ("kill_master", "kill_slave", "stop_master", "cut_replication")
CUT_PAUSE_S = 4.0                     # past the cluster's ha_housekeeping_timeout_ms (3 s)


@dataclass
class HAReport:
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    failovers_s: list[float] = field(default_factory=list)    # kill/stop -> first send acked by the new master
    stores_ok: bool = True
    compared_bytes: int = 0
    bytes_equal: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered) and self.stores_ok and self.bytes_equal

    def summary(self) -> str:
        times = ", ".join(f"{t:.2f}" for t in self.failovers_s)
        return (f"HA: {self.acked} acked, lost {self.lost}, duplicated {self.duplicated}, reordered "
                f"{self.reordered}; failovers (s): [{times}]; stores ok: {self.stores_ok}; commit logs equal "
                f"over {self.compared_bytes} bytes: {self.bytes_equal}")


class _Producer:
    """Sends keys in sequence; `acked[q]` the acknowledged bodies of queue q in order;
    `last_master` and `switches` (monotonic time of each first ack from another master)."""

    def __init__(self, cluster: HACluster, prefix: str) -> None:
        self.cluster, self.prefix = cluster, prefix
        self.acked: dict[int, list[str]] = {q: [] for q in range(QUEUES)}
        self.last_master = -1
        self.switches: list[tuple[float, int]] = []
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            queue_id = self.count % QUEUES
            body, master = await self.cluster.send_acked(f"{self.prefix}{self.count}", queue_id)
            self.acked[queue_id].append(body)
            self.count += 1
            if master != self.last_master:
                self.switches.append((time.monotonic(), master))
                self.last_master = master

    async def wait_acked_by(self, master: int, after: float, timeout_s: float = 60.0) -> float:
        async with asyncio.timeout(timeout_s):
            while True:
                for at, who in self.switches:
                    if who == master and at >= after:
                        return at
                await asyncio.sleep(0.02)


async def pull_all(cluster: HACluster, address: str, queue_id: int) -> list[str]:
    bodies: list[str] = []
    offset = 0
    while True:
        header = PullMessageRequestHeader(consumer_group="ha_check", topic=TOPIC, queue_id=queue_id,
                                          queue_offset=offset, max_msg_nums=256, sys_flag=4, commit_offset=0,
                                          suspend_timeout_ms=0, sub_version=0, subscription="*",
                                          expression_type="TAG")
        result = await cluster.api.pull_message(address, header, 5_000)
        if result.status is not PullStatus.FOUND or not result.messages:
            return bodies
        bodies += [m.body.decode() for m in result.messages]
        offset = result.next_begin_offset


def check_queues(acked: dict[int, list[str]], found: dict[int, list[str]], report: HAReport) -> None:
    """Lost, duplicated and reordered acknowledged bodies, per queue (unacknowledged attempts that
    reached the log are ignored)."""
    for queue_id, expected in acked.items():
        wanted = set(expected)
        seen = [body for body in found.get(queue_id, []) if body in wanted]
        report.acked += len(expected)
        report.duplicated += len(seen) - len(set(seen))
        missing = wanted - set(seen)
        report.lost += len(missing)
        order = [body for body in dict.fromkeys(seen)]
        report.reordered += sum(1 for a, b in zip(order, [e for e in expected if e not in missing], strict=False)
                                if a != b)
        if missing:
            report.problems.append(f"queue {queue_id}: lost {sorted(missing)[:5]}")


def compare_commit_logs(first: Path, second: Path) -> int:
    """Compare two commit logs file by file up to the shorter's written end; returns the bytes
    compared; raises `AssertionError` at the first difference."""
    compared = 0
    names = sorted(p.name for p in (first / "commitlog").iterdir())
    for name in names:
        other = second / "commitlog" / name
        if not other.exists():
            break
        a, b = (first / "commitlog" / name).read_bytes(), other.read_bytes()
        a_end, b_end = len(a.rstrip(b"\0")), len(b.rstrip(b"\0"))
        end = min(a_end, b_end)
        assert a[:end] == b[:end], f"commit-log file {name} differs within the first {end} bytes"
        compared += end
        if a_end != b_end:
            break
    return compared


async def run_ha_cycles(root: Path, *, cycles: int, seed: int, faults: tuple[str, ...] = HA_FAULTS,
                        controllers: int = 1, role: str = "SYNC_MASTER", lease_ms: int = 1_500,
                        heartbeat_ms: int = 200) -> HAReport:
    """Run `cycles` faults drawn from `faults` (seeded) and check everything; see the module doc.
    `lease_ms`: the controllers' broker lease; `heartbeat_ms`: the brokers' report interval."""
    rng = random.Random(seed)
    report = HAReport()
    cluster = HACluster(root, controllers=controllers, lease_ms=lease_ms, role=role, heartbeat_ms=heartbeat_ms)
    producer = _Producer(cluster, f"s{seed}:")
    try:
        await cluster.start()
        await cluster.wait_in_sync(60)
        producer.start()
        for cycle in range(cycles):
            info = await cluster.wait_in_sync(60)
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            fault = rng.choice(faults)
            master, slave = info.master_id, 1 - info.master_id
            log.warning("HA cycle %d: %s (master %d, epoch %d)", cycle, fault, master, info.epoch)
            hit = time.monotonic()
            if fault == "kill_master":
                cluster.kill(master)
                report.failovers_s.append(await producer.wait_acked_by(slave, hit) - hit)
                await cluster.restart(master)
            elif fault == "stop_master":
                cluster.pause(master, True)
                report.failovers_s.append(await producer.wait_acked_by(slave, hit) - hit)
                cluster.pause(master, False)
            elif fault == "kill_slave":
                cluster.kill(slave)
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                await cluster.wait_out_of_sync(30)
                await cluster.restart(slave)
            else:
                cluster.pause(slave, True)
                await asyncio.sleep(CUT_PAUSE_S)
                await cluster.wait_out_of_sync(30)    # the master's watchdog fired and the controller knows
                cluster.pause(slave, False)
        await cluster.wait_in_sync(60)
        await asyncio.sleep(0.5)
        await producer.stop()
        info = await cluster.wait_in_sync(60)
        found = {q: await pull_all(cluster, info.master_addr, q) for q in range(QUEUES)}
        check_queues(producer.acked, found, report)
        if not report.passed or os.environ.get("RQ_HA_DEBUG"):
            for index, process in enumerate([*cluster.controllers, *cluster.brokers]):
                log.error("process %d: %s", index, process.tail(200))
        await asyncio.sleep(1.0)         # the slave acknowledges the tail
    except BaseException:
        for index, process in enumerate([*cluster.controllers, *cluster.brokers]):
            log.error("process %d: %s", index, process.tail(40))
        raise
    finally:
        try:
            await producer.stop()           # raises what the producer's task raised, if anything
        finally:
            await cluster.stop()
    for directory in (root / "a0", root / "a1"):
        store_report = check_store(directory)
        if not store_report.ok:
            report.stores_ok = False
            report.problems.append(f"{directory.name}: {store_report.problems[:3]}")
    try:
        report.compared_bytes = compare_commit_logs(root / "a0", root / "a1")
    except AssertionError as exc:
        report.bytes_equal = False
        report.problems.append(str(exc))
    log.warning("%s", report.summary())
    return report
