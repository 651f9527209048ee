"""`RateLimitedLog`: at most `burst` log lines per `interval_ms`; the first line after a quiet spell
says how many were suppressed. Used for one-line-per-connection events (refused, timed out, expired)
so a flood of bad clients cannot flood the log. Time comes from a `monotonic_ms` callable."""

from __future__ import annotations

import logging
from collections.abc import Callable


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, monotonic_ms: Callable[[], int], *, burst: int = 10,
                 interval_ms: int = 10_000) -> None:
        self._logger, self._monotonic_ms = logger, monotonic_ms
        self._burst, self._interval_ms = burst, interval_ms
        self._window_start_ms = -interval_ms
        self._emitted = 0
        self.suppressed = 0          # lines dropped since the last emitted one

    def allow(self) -> bool:
        """True when a line may be written now (and counts it); False when it is suppressed."""
        now_ms = self._monotonic_ms()
        if now_ms - self._window_start_ms >= self._interval_ms:
            self._window_start_ms, self._emitted = now_ms, 0
        if self._emitted >= self._burst:
            self.suppressed += 1
            return False
        self._emitted += 1
        return True

    def warning(self, message: str, *args: object) -> None:
        """`logger.warning(message, *args)` unless over the rate; then counted in `suppressed`."""
        if not self.allow():
            return
        if self.suppressed:
            message = f"{message} (%d similar lines suppressed)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self._logger.warning(message, *args)
