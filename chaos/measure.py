"""What a chaos run measures around each fault: the broker's resident memory (sampled every
`RSS_SAMPLE_S` from its pid, which changes with every restart) and the latency of acknowledged sends
(first attempt to acknowledgement, retries included, as a producer's caller waits it).

`FaultWindow` is one step's share: from the moment its fault began to the moment the next one did
(or the traffic stopped), so it covers the fault and the recovery after it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psutil

RSS_SAMPLE_S = 0.1
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class FaultWindow:
    peak_rss_bytes: int          # 0 when no sample fell in the window (the broker was down throughout)
    p99_send_ms: float           # 0.0 when no send was acknowledged in it
    max_send_ms: float
    sends: int

    def describe(self) -> str:
        rss = f"{self.peak_rss_bytes / 2**20:.0f} MiB" if self.peak_rss_bytes else "-"
        return (f"peak RSS {rss}, p99 send {self.p99_send_ms:.1f} ms (max {self.max_send_ms:.0f}) over "
                f"{self.sends} sends")


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank) of `values`; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]


class Recorder:
    """Send latencies (`sent(started_at)`, monotonic seconds) and broker RSS samples (`run(pid_of)`
    as a task until cancelled), read back per window."""

    def __init__(self) -> None:
        self._sends: list[tuple[float, float]] = []       # (acknowledged at, latency s), in time order
        self._rss: list[tuple[float, int]] = []           # (sampled at, rss bytes), in time order

    def sent(self, started_at: float) -> None:
        now = time.monotonic()
        self._sends.append((now, now - started_at))

    async def run(self, pid_of: Callable[[], int | None]) -> None:
        """Sample the RSS of the process `pid_of()` names every `RSS_SAMPLE_S` until cancelled;
        a pid that is gone (a restart under way) is skipped."""
        while True:
            pid = pid_of()
            if pid is not None:
                with contextlib.suppress(psutil.Error):
                    self._rss.append((time.monotonic(), psutil.Process(pid).memory_info().rss))
            await asyncio.sleep(RSS_SAMPLE_S)

    def window(self, start: float, end: float) -> FaultWindow:
        sends = _between(self._sends, start, end)
        rss = _between(self._rss, start, end)
        latencies = [latency for _, latency in sends]
        return FaultWindow(max((value for _, value in rss), default=0), p99(latencies) * 1000,
                           max(latencies, default=0.0) * 1000, len(sends))



def _between(series: list[tuple[float, V]], start: float, end: float) -> list[tuple[float, V]]:
    """The entries of a time-ordered series with `start` <= time < `end`."""
    return series[bisect_left(series, start, key=lambda entry: entry[0]):
                  bisect_left(series, end, key=lambda entry: entry[0])]
