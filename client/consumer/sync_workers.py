"""`SyncWorkers`: threads that run sync listener jobs off the event loop, cheaply.

A `ThreadPoolExecutor` round trip costs a `Future`, a `Condition`, a wrapped asyncio future and one
loop wake-up per job; with a no-op listener that overhead, not the listener, set the consume rate.
Here a job is a plain callable put on a `SimpleQueue`; each of `thread_count` threads takes jobs,
and after a job it keeps taking whatever else is queued before reporting back, so one
`call_soon_threadsafe` carries the completions of every job it ran."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
Completion = Callable[[], None]
Job = Callable[[], Completion]     # runs in a worker thread; returns what to run on the loop


class SyncWorkers:
    def __init__(self, thread_count: int, name: str) -> None:
        self._thread_count, self._name = thread_count, name
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_flight = 0
        self._idle = asyncio.Event()

    def submit(self, job: Job) -> None:
        """Queue `job` (called on the loop); its returned completion runs back on the loop."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            for i in range(self._thread_count):
                thread = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
                thread.start()
                self._threads.append(thread)
        self.in_flight += 1
        self._idle.clear()
        self._jobs.put(job)

    def _work(self) -> None:
        jobs, loop = self._jobs, self._loop
        assert loop is not None
        while True:
            job = jobs.get()
            if job is None:
                return
            done: list[Completion] = []
            while job is not None:
                try:
                    done.append(job())
                except BaseException:      # a job reports its own errors; this is a last resort
                    log.exception("%s: job failed", self._name)
                    done.append(_nothing)
                try:
                    job = jobs.get_nowait()
                except queue.Empty:
                    job = None
                if job is None and not jobs.empty():
                    continue
            try:
                loop.call_soon_threadsafe(self._complete, done)
            except RuntimeError:           # the loop is closed: nobody is waiting any more
                return

    def _complete(self, done: list[Completion]) -> None:
        for completion in done:
            self.in_flight -= 1
            try:
                completion()
            except Exception:
                log.exception("%s: completion failed", self._name)
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout_ms: int) -> bool:
        """True once no job is queued or running, False after `timeout_ms`."""
        if self.in_flight == 0:
            return True
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Let the threads end once the queued jobs are done (they are daemons: a listener stuck
        forever does not keep the process alive)."""
        for _ in self._threads:
            self._jobs.put(None)
        self._threads.clear()


def _nothing() -> None:
    return None
