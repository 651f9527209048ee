"""`SyncWorkers`: threads that run sync listener jobs off the event loop, cheaply.

A `ThreadPoolExecutor` round trip costs a `Future`, a `Condition`, a wrapped asyncio future and one
loop wake-up per job; with a no-op listener that overhead, not the listener, set the consume rate.
Here a job is a plain callable in one queue; a thread takes jobs from it until it is empty, then
reports back, so one `call_soon_threadsafe` carries the completions of every job it ran (and at
least every `REPORT_EVERY_S` while the queue never empties: a backlog behind a slow listener).

Which threads run the jobs matters as much under the GIL: every thread woken must wait for the GIL
before it can even find the queue empty. So at most one thread is on its way to the queue at a
time: a `spread` job (the default) wakes an idle thread only when none is already woken, and the
thread that takes a job wakes the next while spread jobs remain, so a burst of jobs that one
thread drains in a single GIL hold costs one wake-up, and a burst of slow jobs still fans out to
as many threads as it needs. The thread woken is the one that went idle last (a stack: its code
and data are still in the caches). A job submitted with `spread=False` (the concurrent consume
service's choice while its listener is fast) wakes no thread while one is running jobs: that
thread takes it, so a fast listener keeps running on one thread however many loop steps hand it
work. A thread per job, each cold and each waiting for the GIL, held a no-op sync listener to
101-174k msg/s from a backlog over 20 threads; this way 162-215k (`make bench`'s client_consume
shape, interleaved runs), with the orderly service's sync listener (30-44k msg/s) and a listener
sleeping 1 ms per call over 20 threads (about 16k msg/s) unchanged. Once the oldest job queued
behind busy threads has waited `SPREAD_AFTER_S` (a listener that turned slow, or blocks), every
queued job becomes a spread one: a blocking listener delays the jobs behind it by about that,
never stalls them. `thread_count` (RocketMQ's `consumeThreadMax`) bounds the threads, which start
on demand."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)
Completion = Callable[[], None]
Job = Callable[[], Completion]     # runs in a worker thread; returns what to run on the loop
SPREAD_AFTER_S = 0.02              # a job queued behind busy threads this long is spread
REPORT_EVERY_S = 0.01              # a thread hands its completions to the loop at least this often
_TAKE_QUEUED = True                # what wakes a thread to take the queue (None: end)


class _Worker:
    __slots__ = ("inbox", "name", "thread")

    def __init__(self, name: str) -> None:
        self.inbox: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        self.name = name
        self.thread: threading.Thread | None = None     # started by the first `_wake`


class SyncWorkers:
    def __init__(self, thread_count: int, name: str) -> None:
        self._thread_count, self._name = max(thread_count, 1), name
        self._lock = threading.Lock()
        # Under `_lock`: idle threads (the last to go idle on top); queued jobs with the time they
        # were queued and their `spread`; threads running jobs or woken to (`_busy`), of which
        # `_waking` are woken and have not taken the queue yet; every thread made; `close` called.
        self._idle: list[_Worker] = []
        self._queued: deque[tuple[Job, float, bool]] = deque()
        self._busy = 0
        self._waking = 0
        self._workers: list[_Worker] = []
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spread_timer: asyncio.TimerHandle | None = None
        self.in_flight = 0
        self._idle_event = asyncio.Event()

    @property
    def thread_count(self) -> int:
        """Threads made so far (at most the `thread_count` given)."""
        return len(self._workers)

    def submit(self, job: Job, *, spread: bool = True, front: bool = False) -> None:
        """Queue `job` (called on the loop); its returned completion runs back on the loop. With
        `spread` a thread is woken for it unless one is already on its way to the queue; without,
        only when no thread is running jobs (see the module docstring). `front` queues it before the
        jobs already queued (work handed back that was submitted before them). Ignored after `close`."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        with self._lock:
            if self._closing:
                return
            if front:
                self._queued.appendleft((job, time.monotonic(), spread))
            else:
                self._queued.append((job, time.monotonic(), spread))
            worker = self._claim() if (not self._waking if spread else not self._busy) else None
        self.in_flight += 1
        self._idle_event.clear()
        if worker is not None:
            self._wake(worker)
        elif not spread:
            self._arm_spread()

    def _claim(self) -> _Worker | None:
        """Under `_lock`: the idle thread to wake (the last to go idle), or a new one while fewer
        than `thread_count` exist; counted busy and waking. None when every thread is busy."""
        if self._idle:
            worker = self._idle.pop()
        elif len(self._workers) < self._thread_count:
            worker = _Worker(f"{self._name}-{len(self._workers)}")
            self._workers.append(worker)
        else:
            return None
        self._busy += 1
        self._waking += 1
        return worker

    def _wake(self, worker: _Worker) -> None:
        if worker.thread is None:
            worker.thread = threading.Thread(target=self._work, args=(worker,), name=worker.name, daemon=True)
            worker.thread.start()
        worker.inbox.put(_TAKE_QUEUED)

    def _arm_spread(self) -> None:
        if self._spread_timer is None and self._loop is not None:
            self._spread_timer = self._loop.call_later(SPREAD_AFTER_S, self._spread)

    def _spread(self) -> None:
        """On the loop: when the oldest queued job has waited `SPREAD_AFTER_S` for the busy
        threads, every queued job becomes a spread one, so idle threads take them, woken one after
        another as for jobs submitted with `spread`."""
        self._spread_timer = None
        with self._lock:
            if not self._queued or self._closing:
                return
            worker = None
            if time.monotonic() - self._queued[0][1] >= SPREAD_AFTER_S:
                self._queued = deque((job, queued_at, True) for job, queued_at, _ in self._queued)
                worker = self._claim() if not self._waking else None
        if worker is not None:
            self._wake(worker)
        self._arm_spread()

    def _work(self, worker: _Worker) -> None:
        loop = self._loop
        assert loop is not None
        while worker.inbox.get() is _TAKE_QUEUED:
            done: list[Completion] = []
            arrived = True
            reported_at = time.monotonic()
            while True:
                with self._lock:
                    if arrived:
                        self._waking -= 1
                        arrived = False
                    if not self._queued:
                        self._busy -= 1
                        stopping = self._closing
                        if not stopping:
                            self._idle.append(worker)
                        break
                    job = self._queued.popleft()[0]
                    # more spread jobs wait: wake the next thread (one on its way at a time)
                    after = self._claim() if self._queued and self._queued[0][2] and not self._waking else None
                if after is not None:
                    self._wake(after)
                try:
                    done.append(job())
                except BaseException:      # a job reports its own errors; this is a last resort
                    log.exception("%s: job failed", self._name)
                    done.append(_nothing)
                now = time.monotonic()
                if now - reported_at >= REPORT_EVERY_S:     # a queue that never empties still reports
                    try:
                        loop.call_soon_threadsafe(self._complete, done)
                    except RuntimeError:       # the loop is closed: nobody is waiting any more
                        return
                    done, reported_at = [], now
            if done:
                try:
                    loop.call_soon_threadsafe(self._complete, done)
                except RuntimeError:           # the loop is closed: nobody is waiting any more
                    return
            if stopping:
                return

    def _complete(self, done: list[Completion]) -> None:
        for completion in done:
            self.in_flight -= 1
            try:
                completion()
            except Exception:
                log.exception("%s: completion failed", self._name)
        if self.in_flight == 0:
            self._idle_event.set()

    async def wait_idle(self, timeout_ms: int) -> bool:
        """True once no job is queued or running, False after `timeout_ms`."""
        if self.in_flight == 0:
            return True
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self._idle_event.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Let the threads end once the queued jobs are done (they are daemons: a listener stuck
        forever does not keep the process alive)."""
        if self._spread_timer is not None:
            self._spread_timer.cancel()
            self._spread_timer = None
        with self._lock:
            self._closing = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.inbox.put(None)


def _nothing() -> None:
    return None
