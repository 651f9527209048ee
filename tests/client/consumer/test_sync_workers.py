"""`SyncWorkers` with real threads: which thread runs a job (the one that went idle last; behind a
busy thread for `spread=False`), the spread of a job stuck behind a blocking one, the thread bound,
and close. Jobs block on `threading.Event`s the test sets; every wait is bounded."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from client.consumer import sync_workers
from client.consumer.sync_workers import SyncWorkers

WAIT_S = 10.0


class Probe:
    """A job that records its thread, optionally blocks until released, and reports its completion
    on the loop (`completed`)."""

    def __init__(self, *, block: bool = False) -> None:
        self.release = threading.Event()
        if not block:
            self.release.set()
        self.started = threading.Event()
        self.thread: int | None = None
        self.completed = asyncio.Event()

    def __call__(self) -> Callable[[], None]:
        self.thread = threading.get_ident()
        self.started.set()
        assert self.release.wait(WAIT_S)
        return self.completed.set


async def started(probe: Probe) -> None:
    assert await asyncio.to_thread(probe.started.wait, WAIT_S)


async def running(workers: SyncWorkers, *, spread: bool = True) -> Probe:
    """A blocking job submitted and started."""
    probe = Probe(block=True)
    workers.submit(probe, spread=spread)
    await started(probe)
    return probe


async def completed(*probes: Probe) -> None:
    async with asyncio.timeout(WAIT_S):
        for probe in probes:
            await probe.completed.wait()


async def test_jobs_submitted_without_spread_wait_behind_the_busy_thread_and_run_on_it() -> None:
    workers = SyncWorkers(20, "t")
    first = await running(workers, spread=False)
    second, third = Probe(), Probe()
    workers.submit(second, spread=False)
    workers.submit(third, spread=False)
    assert not second.started.is_set() and workers.thread_count == 1 and workers.in_flight == 3
    first.release.set()
    await completed(first, second, third)
    assert first.thread == second.thread == third.thread
    assert workers.thread_count == 1
    assert await workers.wait_idle(1000)
    workers.close()


async def test_a_spread_job_goes_to_another_thread_at_once() -> None:
    workers = SyncWorkers(20, "t")
    blocking, other = await running(workers), Probe()
    workers.submit(other)
    await completed(other)
    assert other.thread != blocking.thread and workers.thread_count == 2
    blocking.release.set()
    await completed(blocking)
    workers.close()


async def test_jobs_stuck_behind_a_blocking_one_are_spread_after_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_workers, "SPREAD_AFTER_S", 0.05)
    workers = SyncWorkers(20, "t")
    blocking = await running(workers, spread=False)
    also_blocking, queued = Probe(block=True), Probe()
    loop = asyncio.get_running_loop()
    queued_at = loop.time()
    workers.submit(also_blocking, spread=False)
    workers.submit(queued, spread=False)
    await completed(queued)             # while the first two still block: three threads
    assert loop.time() - queued_at >= 0.05
    assert not blocking.completed.is_set() and not also_blocking.completed.is_set()
    assert len({blocking.thread, also_blocking.thread, queued.thread}) == 3
    blocking.release.set()
    also_blocking.release.set()
    await completed(blocking, also_blocking)
    workers.close()


async def test_a_burst_of_spread_jobs_fans_out_one_wake_at_a_time() -> None:
    workers = SyncWorkers(20, "t")
    probes = [Probe(block=True) for _ in range(4)]
    for probe in probes:                # one loop step: only the first wakes a thread itself
        workers.submit(probe)
    for probe in probes:
        await started(probe)            # each thread that took one woke the next
    assert len({probe.thread for probe in probes}) == 4 and workers.thread_count == 4
    for probe in probes:
        probe.release.set()
    await completed(*probes)
    workers.close()


async def test_an_idle_job_goes_to_the_thread_that_went_idle_last() -> None:
    workers = SyncWorkers(20, "t")
    a, b = Probe(block=True), Probe(block=True)
    workers.submit(a)
    workers.submit(b)
    await started(a)
    await started(b)
    assert a.thread != b.thread
    b.release.set()
    await completed(b)
    a.release.set()
    await completed(a)                  # a's thread is now the last to go idle
    after = Probe()
    workers.submit(after)
    await completed(after)
    assert after.thread == a.thread
    workers.close()


async def test_at_most_thread_count_threads_run_and_queued_jobs_wait_for_one() -> None:
    workers = SyncWorkers(2, "t")
    probes = [Probe(block=True) for _ in range(3)]
    for probe in probes:
        workers.submit(probe)
    await started(probes[0])
    await started(probes[1])
    assert not probes[2].started.is_set() and workers.thread_count == 2
    probes[1].release.set()
    await started(probes[2])
    assert probes[2].thread == probes[1].thread
    probes[0].release.set()
    probes[2].release.set()
    await completed(*probes)
    assert workers.thread_count == 2
    workers.close()


async def test_close_lets_queued_jobs_finish_then_the_threads_end_and_later_jobs_are_ignored() -> None:
    workers = SyncWorkers(1, "closing")
    first, queued = await running(workers), Probe()
    workers.submit(queued)
    workers.close()
    first.release.set()
    await completed(first, queued)
    assert await workers.wait_idle(1000)
    threads = [t for t in threading.enumerate() if t.name == "closing-0"]
    assert len(threads) <= 1
    for thread in threads:
        await asyncio.to_thread(thread.join, WAIT_S)
        assert not thread.is_alive()
    workers.submit(Probe())             # nobody would run it: not taken, not counted
    assert workers.in_flight == 0 and workers.thread_count == 1


async def test_a_thread_whose_queue_never_empties_still_reports_its_completions() -> None:
    """A slow listener behind a backlog: the thread always finds another job queued, yet the loop
    gets the completions of the jobs it ran (and `in_flight` counts down) at least every
    `REPORT_EVERY_S` of work."""
    workers = SyncWorkers(1, "t")
    first = await running(workers)
    blocker = Probe(block=True)
    waiting = [Probe() for _ in range(3)]

    def slow(probe: Probe) -> Callable[[], Callable[[], None]]:
        def job() -> Callable[[], None]:
            time.sleep(sync_workers.REPORT_EVERY_S * 1.5)      # the listener's work, not a wait
            return probe()
        return job
    jobs: list[Callable[[], Callable[[], None]]] = [*map(slow, waiting), blocker]
    for job in jobs:
        workers.submit(job)
    first.release.set()
    await started(blocker)             # the three before it ran; the queue was never empty meanwhile
    await completed(first, *waiting)   # ... and their completions reached the loop while it blocks
    assert workers.in_flight == 1
    blocker.release.set()
    await completed(blocker)
    workers.close()
