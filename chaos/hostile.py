"""The hostile-load fault kinds of a chaos run, applied to the run's broker while its traffic goes on:
each runs its fault module for the step's `pause_s` and turns the module's result into one report
line and a count of what it lost (acknowledged messages or topics that did not survive).

`disk-fill` needs the broker's store on a small file system of its own: `small_store_disk` mounts a
tmpfs for it (root only); without one the kind is left out of the schedule, saying why."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.process import BrokerSubprocess
from chaos.disk_fill import SMALL_STORE_SETTINGS, disk_fill
from chaos.heartbeat_flood import heartbeat_flood
from chaos.schedule import FaultStep
from chaos.topic_create_kill import topic_create_kill
from chaos.unread_pulls import unread_pulls

HOSTILE_FAULTS = frozenset({"unread-pulls", "heartbeat-flood", "topic-create-kill", "disk-fill"})
DISK_BYTES = 512 << 20          # the tmpfs of a run with disk-fill: room for 20 cycles of traffic
DISK_SETTINGS = SMALL_STORE_SETTINGS
FLOOD_CLIENT_IDS = 2_000       # past max_consumers_per_group (1,000): the bound is met too
UNREAD_MESSAGES = 120          # 150 KB each, pulled and never read (18 MB a time: room on the tmpfs)


@dataclass(frozen=True, slots=True)
class HostileOutcome:
    lost: int            # acknowledged messages (or topics) the fault made unreachable: must be 0
    detail: str          # one line for the report


@contextlib.contextmanager
def small_store_disk(path: Path, size_bytes: int = DISK_BYTES) -> Iterator[Path | None]:
    """A tmpfs of `size_bytes` mounted at `path` for the run's store, unmounted after; None (and
    nothing mounted) when this process cannot mount one (not root, no tmpfs)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield None
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


async def apply_hostile(step: FaultStep, broker: BrokerSubprocess, disk: Path | None, *,
                        group: str, topic: str) -> HostileOutcome:
    """Run `step`'s hostile fault against `broker` (left running at the end) for `step.pause_s`;
    the heartbeat flood joins `group` (subscribing `topic`), the group of the run's real consumers,
    so its fake members take queues from them until they leave."""
    if step.fault == "unread-pulls":
        unread = await unread_pulls(broker.address, broker.pid, duration_s=step.pause_s, messages=UNREAD_MESSAGES)
        return HostileOutcome(0, f"broker RSS {unread.baseline_rss_bytes / 2**20:.0f} -> peak "
                                 f"{unread.peak_rss_bytes / 2**20:.0f} -> {unread.after_rss_bytes / 2**20:.0f} MiB "
                                 f"{unread.settled_after_s:.1f} s after; probe p99 {unread.probe_p99_ms:.1f} ms over "
                                 f"{unread.probe_round_trips} round trips, {unread.probe_failures} failed")
    if step.fault == "heartbeat-flood":
        flood = await heartbeat_flood(broker.address, duration_s=step.pause_s, pid=broker.pid,
                                      client_ids=FLOOD_CLIENT_IDS, group=group, topic=topic)
        return HostileOutcome(0, f"{flood.client_ids} fake client ids: {flood.accepted} heartbeats accepted, "
                                 f"{flood.refused} refused, {flood.notices} notices; probe send p99 "
                                 f"{flood.p99_send_ms:.1f} ms (max {flood.max_send_ms:.0f})")
    if step.fault == "topic-create-kill":
        kill = await topic_create_kill(broker, duration_s=step.pause_s)
        return HostileOutcome(kill.lost + kill.topics_lost,
                              f"{kill.cycles} kills at most {kill.kill_after_create_ms:.0f} ms after a create, "
                              f"{kill.topics_created} topics and {kill.acknowledged} messages acknowledged, "
                              f"{kill.topics_lost} topics and {kill.lost} messages lost")
    if step.fault == "disk-fill":
        if disk is None:
            raise ValueError("disk-fill needs the store on a small file system of its own (small_store_disk)")
        fill = await disk_fill(broker, duration_s=step.pause_s, filler_dir=disk)
        return HostileOutcome(fill.lost_after_free + fill.lost_after_restart + fill.crashed,
                              f"{fill.acknowledged} acknowledged, {fill.refused} refused while full, crashed "
                              f"{fill.crashed}, resumed {fill.resumed_after_free_ms:.0f} ms after the space was "
                              f"freed, came up on the full disk: {fill.restarted_when_full}, lost "
                              f"{fill.lost_after_free + fill.lost_after_restart}")
    raise ValueError(f"not a hostile fault: {step.fault}")
