"""`Service`: start, wakeup, wait and a bounded stop."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from protocol.service import Service

WAIT_S = 5


class Ticker(Service):
    """Counts loop iterations; `ticked` is set after each one."""

    name = "ticker"

    def __init__(self, interval_ms: int) -> None:
        super().__init__()
        self.interval_ms, self.ticks, self.finished = interval_ms, 0, False
        self.ticked = asyncio.Event()

    async def run(self) -> None:
        while await self.wait(self.interval_ms):
            self.ticks += 1
            self.ticked.set()
        self.finished = True


class Stubborn(Service):
    """Ignores stopping; records that it was cancelled."""

    name = "stubborn"
    stop_timeout_ms = 50

    def __init__(self) -> None:
        super().__init__()
        self.started, self.cancelled = asyncio.Event(), False

    async def run(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class Failing(Service):
    name = "failing"

    async def run(self) -> None:
        raise RuntimeError("boom")


async def test_nothing_runs_before_start() -> None:
    ticker = Ticker(interval_ms=1)
    ticker.wakeup()
    await ticker.stop()                    # stopping a service that never started is a no-op
    assert ticker.ticks == 0 and not ticker.finished


async def test_wakeup_runs_the_loop_at_once() -> None:
    ticker = Ticker(interval_ms=60_000)
    async with asyncio.timeout(WAIT_S):
        await ticker.start()
        for expected in (1, 2, 3):
            ticker.ticked.clear()
            ticker.wakeup()
            await ticker.ticked.wait()
            assert ticker.ticks == expected
        await ticker.stop()
    assert ticker.finished and ticker.stopping


async def test_wait_returns_true_after_the_interval() -> None:
    ticker = Ticker(interval_ms=10)
    async with asyncio.timeout(WAIT_S):
        started = time.monotonic()
        await ticker.start()
        await ticker.ticked.wait()           # no wakeup: the 10 ms interval elapsed
        assert time.monotonic() - started >= 0.009
        await ticker.stop()
    assert ticker.finished


async def test_stop_makes_wait_return_false_and_awaits_run() -> None:
    ticker = Ticker(interval_ms=60_000)
    async with asyncio.timeout(WAIT_S):
        await ticker.start()
        assert not ticker.stopping
        await ticker.stop()                  # wakes the 60 s wait; run() returns on its own
    assert ticker.finished and ticker.ticks == 0
    assert await ticker.wait(60_000) is False


async def test_start_twice_raises() -> None:
    ticker = Ticker(interval_ms=60_000)
    async with asyncio.timeout(WAIT_S):
        await ticker.start()
        with pytest.raises(RuntimeError, match="already started"):
            await ticker.start()
        await ticker.stop()
        await ticker.stop()                  # a second stop is a no-op


async def test_stop_cancels_a_run_that_ignores_stopping(caplog: pytest.LogCaptureFixture) -> None:
    service = Stubborn()
    async with asyncio.timeout(WAIT_S):
        await service.start()
        await service.started.wait()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="protocol.service"):
            await service.stop()
        elapsed = time.monotonic() - started
    assert service.cancelled
    assert 0.04 <= elapsed < 1.0
    assert "stubborn did not stop within 50 ms" in caplog.text


async def test_a_failing_run_is_logged_and_stop_still_works(caplog: pytest.LogCaptureFixture) -> None:
    service = Failing()
    with caplog.at_level(logging.ERROR, logger="protocol.service"):
        async with asyncio.timeout(WAIT_S):
            await service.start()
            await service.stop()
    assert "service failing failed" in caplog.text
