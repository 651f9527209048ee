"""`RateLimitedLog`: at most `burst` log lines per `interval_ms` for each message template; the lines
past it are counted, and reported by the next line of that template or, if none comes, by `flush`
("N similar lines suppressed"), which the connection guard calls on every sweep. Used for every
line that bad input can cause (refused, timed-out and expired connections, protocol errors,
requests that failed inside the broker), so a flood of bad clients cannot flood the log: 5,000
garbage connections log at most `burst` lines of each kind per interval plus one summary each.
Time comes from a `monotonic_ms` callable."""

from __future__ import annotations

import logging
from collections.abc import Callable


class _Window:
    """One template's state: when its window began, lines written in it, lines suppressed since
    the last line written."""

    __slots__ = ("emitted", "started_ms", "suppressed")

    def __init__(self, started_ms: int) -> None:
        self.started_ms, self.emitted, self.suppressed = started_ms, 0, 0


class RateLimitedLog:
    """Rate-limited `warning` / `error` lines of one logger, counted per message template (the
    format string, so "closing %s: ..." lines of every peer share one budget)."""

    def __init__(self, logger: logging.Logger, monotonic_ms: Callable[[], int], *, burst: int = 10,
                 interval_ms: int = 10_000) -> None:
        self._logger, self._monotonic_ms = logger, monotonic_ms
        self._burst, self._interval_ms = burst, interval_ms
        self._windows: dict[str, _Window] = {}

    @property
    def suppressed(self) -> int:
        """Lines dropped (all templates) and not yet reported."""
        return sum(window.suppressed for window in self._windows.values())

    def allow(self, message: str = "") -> bool:
        """True when a line of template `message` may be written now (and counts it); False when it
        is suppressed (and counted for the next report)."""
        now_ms = self._monotonic_ms()
        window = self._windows.get(message)
        if window is None:
            window = self._windows[message] = _Window(now_ms)
        elif now_ms - window.started_ms >= self._interval_ms:
            window.started_ms, window.emitted = now_ms, 0
        if window.emitted >= self._burst:
            window.suppressed += 1
            return False
        window.emitted += 1
        return True

    def warning(self, message: str, *args: object) -> None:
        """`logger.warning(message, *args)` unless over the rate; then counted in `suppressed`."""
        self._log(logging.WARNING, message, args, None)

    def error(self, message: str, *args: object, exc_info: BaseException | None = None) -> None:
        """`logger.error(message, *args, exc_info=exc_info)` unless over the rate."""
        self._log(logging.ERROR, message, args, exc_info)

    def _log(self, level: int, message: str, args: tuple[object, ...], exc_info: BaseException | None) -> None:
        if not self.allow(message):
            return
        window = self._windows[message]
        if window.suppressed:
            args = (*args, window.suppressed)
            message = f"{message} (%d similar lines suppressed)"
            window.suppressed = 0
        self._logger.log(level, message, *args, exc_info=exc_info)

    def flush(self) -> None:
        """Write one summary line per template whose suppressed lines no later line reported and
        whose window has ended ("N similar lines suppressed in the last S s: <template>"); forget
        templates quiet for a whole window (the table stays as small as the set of templates in use)."""
        now_ms = self._monotonic_ms()
        for message, window in list(self._windows.items()):
            if now_ms - window.started_ms < self._interval_ms:
                continue
            if window.suppressed:
                self._logger.warning("%d similar lines suppressed in the last %d s: %s", window.suppressed,
                                     (now_ms - window.started_ms) // 1000, message)
                window.started_ms, window.emitted, window.suppressed = now_ms, 1, 0
            else:
                del self._windows[message]
