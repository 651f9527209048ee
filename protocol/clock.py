"""Clocks: wall time for stored timestamps, monotonic time for deadlines. Tests pass `ManualClock`."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told (`advance`)."""

    def __init__(self, now_ms: int = 1_700_000_000_000, monotonic_ms: int = 0) -> None:
        self._now_ms, self._monotonic_ms = now_ms, monotonic_ms

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> int:
        return self._monotonic_ms

    def advance(self, ms: int) -> None:
        self._now_ms += ms
        self._monotonic_ms += ms
