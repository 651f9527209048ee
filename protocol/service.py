"""`Service`: the lifecycle of every long-lived loop (STYLE.md "A background service").

Nothing starts in `__init__`. `start()` creates the one owned task running `run()`; `stop()` asks it
to finish (`wait()` returns False from then on), awaits it for at most `stop_timeout_ms`, then
cancels it and logs what it cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Service:
    name: str = "service"
    stop_timeout_ms: int = 5_000

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False

    async def run(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"{self.name} already started")
        self._stopping = False
        self._task = asyncio.create_task(self._run_logged(), name=self.name)

    async def _run_logged(self) -> None:
        try:
            await self.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("service %s failed", self.name)

    def wakeup(self) -> None:
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def wait(self, interval_ms: int) -> bool:
        """Sleep up to `interval_ms` or until `wakeup()`; True to go on, False once stopping."""
        if self._stopping:
            return False
        if not self._wake.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_ms / 1000):
                    await self._wake.wait()
        self._wake.clear()
        return not self._stopping

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._wake.set()
        done, _ = await asyncio.wait({task}, timeout=self.stop_timeout_ms / 1000)
        if not done:
            log.warning("service %s did not stop within %d ms; cancelling", self.name, self.stop_timeout_ms)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class PeriodicService(Service):
    """Runs `action` every `interval_ms` (or at once on `wakeup()`). An exception of the types in
    `errors` is logged and the next round goes on; anything else ends the service (and is logged)."""

    def __init__(self, name: str, interval_ms: int, action: Callable[[], Awaitable[None]],
                 errors: tuple[type[BaseException], ...] = (Exception,)) -> None:
        super().__init__()
        self.name, self._interval_ms, self._action, self._errors = name, interval_ms, action, errors

    async def run(self) -> None:
        while await self.wait(self._interval_ms):
            try:
                await self._action()
            except self._errors:
                log.exception("%s failed; trying again in %d ms", self.name, self._interval_ms)
