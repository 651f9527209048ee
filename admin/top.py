"""`rocketq top [--group G] [--sort lag|tps|topic|group]`: a live terminal view of consumer groups
(rich Live), refreshed every second: per group and queue the lag (messages and time), the rate in
(broker offset) and out (committed offset) since the previous refresh, the owning client, and the
broker's held pulls and connections; most lag first unless sorted otherwise (`admin/top_view.py`
lays it out). `s` cycles the sort, `q` quits (Ctrl-C too). Talks the wire protocol like the admin
commands; a broker that cannot be reached is one line and exit code 2."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import termios
import time
import tty
from collections.abc import Iterator

import click
from rich.console import Console
from rich.live import Live

from admin.base import example_epilog
from admin.common import endpoints_option, run_admin
from admin.consumer import owners, running_infos
from admin.top_view import SORTS, Snapshot, next_sort, render
from client.admin_api import AdminAPI

REFRESH_S = 1.0


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


class Keys:
    """What the keys asked for: `s` the next sort, `q` to quit; `pressed` is set on each."""

    def __init__(self, sort: str) -> None:
        self.sort, self.quit, self.pressed = sort, False, asyncio.Event()

    def on_key(self, key: str) -> None:
        if key in ("q", "Q"):
            self.quit = True
        elif key in ("s", "S"):
            self.sort = next_sort(self.sort)
        self.pressed.set()


async def watch(api: AdminAPI, address: str, group: str | None, iterations: int | None, sort: str) -> None:
    """Refresh every `REFRESH_S` until `iterations` screens were shown or `q`; a key shows the
    same snapshot again at once (a new sort) without waiting for the next refresh."""
    keys = Keys(sort)
    loop = asyncio.get_running_loop()
    with keys_without_echo() as reading:
        if reading:
            loop.add_reader(sys.stdin.fileno(), lambda: keys.on_key(sys.stdin.read(1)))
        try:
            previous: Snapshot | None = None
            shown = 0
            console = Console() if sys.stdout.isatty() else Console(width=160)
            with Live(console=console, auto_refresh=False, transient=False) as live:
                while not keys.quit and (iterations is None or shown < iterations):
                    snapshot = await take_snapshot(api, address, group)
                    live.update(render(snapshot, previous, address, sort=keys.sort, width=console.width,
                                       keys=reading), refresh=True)
                    shown += 1
                    deadline = loop.time() + REFRESH_S
                    while not keys.quit and (iterations is None or shown < iterations) and loop.time() < deadline:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(keys.pressed.wait(), deadline - loop.time())
                        if keys.pressed.is_set() and not keys.quit:
                            live.update(render(snapshot, previous, address, sort=keys.sort, width=console.width,
                                               keys=reading), refresh=True)
                        keys.pressed.clear()
                    previous = snapshot
        finally:
            if reading:
                loop.remove_reader(sys.stdin.fileno())


@click.command("top", epilog=example_epilog("rocketq top --group billing --sort tps"))
@click.option("--group", "-g", default=None, help="Only this consumer group.")
@click.option("--iterations", "-i", type=click.IntRange(1), default=None,
              help="Stop after this many refreshes (scripts); default: until q or Ctrl-C.")
@click.option("--sort", type=click.Choice(SORTS), default="lag", show_default=True,
              help="Row order: lag (most first), tps (fastest consumed first), topic or group (by name); "
                   "the s key cycles it. E.g. rocketq top --sort tps.")
@endpoints_option
def top(group: str | None, iterations: int | None, sort: str, endpoints: str) -> None:
    """Live view of consumer lag, rates in and out, owners and held pulls; s cycles the sort, q quits."""
    with contextlib.suppress(KeyboardInterrupt):
        run_admin(endpoints, lambda api, address: watch(api, address, group, iterations, sort), timeout_s=None)
