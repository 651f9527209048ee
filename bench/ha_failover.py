"""`ha_failover`: time from SIGKILL of a SYNC_MASTER to the first send acknowledged by the slave the
controller elected (issue 39's targets: <= 10 s with default settings, <= 3 s with short leases).

Processes on loopback (`chaos.ha_cycles`): a controller, a master and a slave, one producer sending
unique keys in sequence and learning the master from the controller. `default`: the controller's
`broker_lease_ms` 6000 and the brokers' `controller_heartbeat_interval_ms` 1000 (the shipped
defaults); `short`: 1500 and 200. Each kill is followed by the old master's restart (it rejoins as
slave) and the check of every acknowledged message (none lost, none reordered), which must pass.
Rows: `ha_failover.<default|short>.median_s` and `.max_s`. A client that follows name-server routes
instead adds up to its `poll_route_interval_ms` (docs/ha.md)."""

from __future__ import annotations

import random
import statistics
import tempfile
from pathlib import Path

from bench.common import Options, store_root
from bench.report import BenchResult
from chaos.ha_cycles import run_ha_cycles

SETTINGS = {"default": (6_000, 1_000, 10.0), "short": (1_500, 200, 3.0)}   # lease ms, heartbeat ms, target s


async def ha_failover(result: BenchResult, opts: Options) -> None:
    kills = 2 if opts.quick else 5
    result.params = {"kills": kills, "settings": {k: {"lease_ms": v[0], "heartbeat_ms": v[1]}
                                                  for k, v in SETTINGS.items()}}
    for name, (lease_ms, heartbeat_ms, target_s) in SETTINGS.items():
        with tempfile.TemporaryDirectory(prefix="rocketq-bench-failover-", dir=store_root()) as directory:
            report = await run_ha_cycles(Path(directory), cycles=kills, seed=random.randrange(1 << 31),
                                         faults=("kill_master",), lease_ms=lease_ms, heartbeat_ms=heartbeat_ms)
        result.details[name] = {"failovers_s": report.failovers_s, "acked": report.acked, "lost": report.lost,
                                "summary": report.summary()}
        if not report.passed:
            result.ok = False
            result.error = f"{name}: {report.summary()} {report.problems[:3]}"
        times = report.failovers_s or [0.0]
        result.add(f"ha_failover.{name}.median_s", round(statistics.median(times), 2), "s", ("≤", target_s))
        result.add(f"ha_failover.{name}.max_s", round(max(times), 2), "s", ("≤", target_s))
