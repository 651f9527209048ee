"""Two broker processes side by side, an "off" one and an "on" one, sent to in alternating slices:
how `auth_cost` and `trace_cost` tell a cost of a few per cent on this machine.

This machine's speed for the same work moves by up to 1.8x from one second to the next (a fixed CPU
loop in a fresh process, alone: 0.39-0.72 s; docs/performance.md, November 27), so one broker
measured after the other cannot tell a 5 or 10 % cost from the machine's drift. Here both brokers
run at once, each prepared and warmed, and get `slices` slices of the same work in turn, (off, on),
(on, off), ...: adjacent slices are well under a second apart, so each pair's ratio sees the same
machine. The ratio row is the median over every pair; the rate and CPU rows are the slices' medians.
Which broker starts, connects and warms up first alternates from round to round (`side_by_side`):
an A/A run (both brokers alike) read the second one's CPU per message 4-5 % above the first's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from bench.broker_proc import BrokerProcess
from bench.common import Options, running_broker
from bench.report import BenchResult

Slice = tuple[float, float, float]          # messages/s, broker CPU µs per message, client CPU µs per message
SliceRunner = Callable[[int], Awaitable[Slice]]     # slice index → its figures


@asynccontextmanager
async def side_by_side(opts: Options, settings: dict[bool, dict[str, str]],
                       round_index: int) -> AsyncIterator[dict[bool, BrokerProcess]]:
    """The off (False) and on (True) brokers with their `settings`, running at once; the one started
    first (and listed first, so prepared and warmed first) is off in even rounds, on in odd ones."""
    order = (True, False) if round_index % 2 else (False, True)
    async with running_broker(opts, settings[order[0]]) as first, running_broker(opts, settings[order[1]]) as second:
        yield {order[0]: first, order[1]: second}


async def alternate(runners: dict[bool, SliceRunner], slices: int) -> dict[bool, list[Slice]]:
    """`slices` slices of each runner (False: off, True: on), in turn: (off, on), (on, off), ..."""
    found: dict[bool, list[Slice]] = {False: [], True: []}
    for index in range(slices):
        for on in ((False, True) if index % 2 == 0 else (True, False)):
            found[on].append(await runners[on](index))
    return found


class PairedRows:
    """The slices of every round of one row, and the rows `report` adds: `<label>.off`, `.on`
    (msg/s), `.on_vs_off` (% with `target`), `.broker_us_per_msg.{off,on}` and, with `client`,
    `.client_us_per_msg.{off,on}`."""

    def __init__(self) -> None:
        self.slices: dict[bool, list[Slice]] = {False: [], True: []}
        self.ratios: list[float] = []

    def add_round(self, found: dict[bool, list[Slice]]) -> None:
        for side in (False, True):
            self.slices[side] += found[side]
        self.ratios += [100 * on[0] / off[0] for off, on in zip(found[False], found[True], strict=True)]

    def report(self, result: BenchResult, label: str, target_percent: float, client: bool = True) -> None:
        median = {side: [statistics.median(one[i] for one in self.slices[side]) for i in range(3)]
                  for side in (False, True)}
        result.add(f"{label}.off", round(median[False][0]), "msg/s")
        result.add(f"{label}.on", round(median[True][0]), "msg/s")
        result.add(f"{label}.on_vs_off", round(statistics.median(self.ratios), 1), "%", ("≥", target_percent))
        for index, name in ((1, "broker"), (2, "client")) if client else ((1, "broker"),):
            for side in (False, True):
                result.add(f"{label}.{name}_us_per_msg.{'on' if side else 'off'}", round(median[side][index], 2),
                           "µs")
        details: dict[str, object] = {"ratios": [round(r, 1) for r in self.ratios]}
        for index, name in ((0, "rates"), (1, "broker_us"), (2, "client_us")):
            for side in (False, True):
                details[f"{name}_{'on' if side else 'off'}"] = [round(s[index], 2 if index else 0)
                                                                 for s in self.slices[side]]
        details["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        result.details[label] = details
