"""`rocketq top [--group G]`: a live terminal view of consumer groups (rich Live), refreshed every
second: per group and queue the lag (messages and time), the rate in (broker offset) and out
(committed offset) since the previous refresh, the owning client, and the broker's held pulls and
connections. `q` quits (Ctrl-C too). Talks the wire protocol like the admin commands; a broker that
cannot be reached is one line and exit code 2."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass, field

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from admin.common import endpoints_option, format_duration_ms, run_admin
from admin.consumer import OwnerKey, owners, running_infos
from client.admin_api import AdminAPI
from protocol.bodies import BrokerRuntimeInfo, QueueConsumeStats

REFRESH_S = 1.0


@dataclass
class Snapshot:
    """One refresh: stats per group, owners, broker info, and when it was taken."""

    at_s: float
    broker: BrokerRuntimeInfo
    queues: dict[str, list[QueueConsumeStats]] = field(default_factory=dict)
    owners: dict[str, dict[OwnerKey, str]] = field(default_factory=dict)


async def take_snapshot(api: AdminAPI, address: str, group: str | None) -> Snapshot:
    snapshot = Snapshot(time.monotonic(), await api.get_broker_runtime_info(address))
    groups = [group] if group else [g.group_name for g in await api.get_all_subscription_groups(address)]
    for name in groups:
        stats = await api.get_consume_stats(address, name)
        if not stats.offset_table:
            continue
        snapshot.queues[name] = stats.offset_table
        _, infos = await running_infos(api, [address], name)
        snapshot.owners[name] = owners(infos)
    return snapshot


def render(snapshot: Snapshot, previous: Snapshot | None, address: str) -> Group:
    """The screen: a header line and one table of every (group, topic, queue)."""
    elapsed = snapshot.at_s - previous.at_s if previous else 0.0
    before = {(g, q.topic, q.queue_id): q for g, qs in (previous.queues.items() if previous else []) for q in qs}
    table = Table(expand=True)
    for name in ("group", "topic", "queue", "lag", "lag time", "in/s", "out/s", "owner"):
        table.add_column(name, justify="right" if name in ("queue", "lag", "in/s", "out/s") else "left",
                         no_wrap=True, overflow="ellipsis")
    total_lag = 0
    for group, queues in sorted(snapshot.queues.items()):
        for q in queues:
            lag = max(0, q.broker_offset - q.consumer_offset)
            total_lag += lag
            old = before.get((group, q.topic, q.queue_id))
            rate_in = rate_out = "-"
            if old is not None and elapsed > 0:
                rate_in = f"{(q.broker_offset - old.broker_offset) / elapsed:.1f}"
                rate_out = f"{max(0, q.consumer_offset - old.consumer_offset) / elapsed:.1f}"
            owner = snapshot.owners.get(group, {}).get((q.broker_name, q.topic, q.queue_id), "")
            table.add_row(group, q.topic, str(q.queue_id), str(lag), format_duration_ms(q.lag_latency_ms), rate_in,
                          rate_out, owner)
    info = snapshot.broker
    header = Text(f"rocketq top  {info.broker_name} at {address}  up {format_duration_ms(info.uptime_ms)}  "
                  f"held pulls {info.held_pulls}  connections {info.connections}  groups {len(snapshot.queues)}  "
                  f"total lag {total_lag}  (q quits)", style="bold")
    return Group(header, table)


@contextlib.contextmanager
def keys_without_echo() -> Iterator[bool]:
    """cbreak mode on a terminal stdin (restored afterwards); yields whether keys can be read."""
    if not sys.stdin.isatty():
        yield False
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def watch(api: AdminAPI, address: str, group: str | None, iterations: int | None) -> None:
    quit_pressed = asyncio.Event()
    loop = asyncio.get_running_loop()
    with keys_without_echo() as reading:
        if reading:
            def on_key() -> None:
                if sys.stdin.read(1) in ("q", "Q"):
                    quit_pressed.set()
            loop.add_reader(sys.stdin.fileno(), on_key)
        try:
            previous: Snapshot | None = None
            shown = 0
            console = Console() if sys.stdout.isatty() else Console(width=160)
            with Live(console=console, auto_refresh=False, transient=False) as live:
                while iterations is None or shown < iterations:
                    snapshot = await take_snapshot(api, address, group)
                    live.update(render(snapshot, previous, address), refresh=True)
                    previous, shown = snapshot, shown + 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(quit_pressed.wait(), REFRESH_S)
                    if quit_pressed.is_set():
                        break
        finally:
            if reading:
                loop.remove_reader(sys.stdin.fileno())


@click.command("top")
@click.option("--group", "-g", default=None, help="Only this consumer group.")
@click.option("--iterations", "-i", type=click.IntRange(1), default=None,
              help="Stop after this many refreshes (scripts); default: until q or Ctrl-C.")
@endpoints_option
def top(group: str | None, iterations: int | None, endpoints: str) -> None:
    """Live view of consumer lag, rates in and out, owners and held pulls; q quits."""
    with contextlib.suppress(KeyboardInterrupt):
        run_admin(endpoints, lambda api, address: watch(api, address, group, iterations), timeout_s=None)
