"""Flush services (RocketMQ `GroupCommitService`, `FlushRealTimeService`, `FlushConsumeQueueService`).

fsync always runs in a thread, never on the event loop: SYNC_FLUSH's rounds in one long-lived
fsync thread (`FsyncThread`), the other flushes in a worker thread (`asyncio.to_thread`).

- SYNC_FLUSH with group commit: a sender awaits `wait_flushed(end_offset)` (or hands over a future,
  `resolve_when_flushed`); each round covers everything written when it starts, then resolves
  every waiter at or below that offset, so concurrent sends share one fsync; a waiter that comes
  while a round is out is covered by the next, started as soon as that round is done. A waiter
  not resolved within `sync_flush_timeout_ms` gets `FlushDiskTimeoutError`; one whose fsync
  failed gets the store's write error.
- ASYNC_FLUSH: a flush every `flush_interval_ms` when something was written; `wait_flushed` returns
  at once.
- Consume queues: every `flush_consume_queue_interval_ms`, then the checkpoint is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from broker.store import fsync_thread
from broker.store.checkpoint import Checkpoint, write_checkpoint
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from broker.store.fsync_thread import FsyncRounds, FsyncThread, NativeFsyncThread
from broker.store.results import FlushDiskTimeoutError, StoreNotWritableError
from broker.store.segment import fdatasync_paths
from protocol.service import Service

log = logging.getLogger(__name__)

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class Settable(Protocol[T_contra]):
    """What `resolve_when_flushed` resolves: an asyncio future, or anything with its three methods
    (the dispatcher's `Deferred`, which answers inside `set_result`)."""

    def done(self) -> bool: ...

    def set_result(self, value: T_contra, /) -> None: ...

    def set_exception(self, exc: BaseException, /) -> None: ...


class CommitLogFlushService(Service):
    """`flushed_offset`: every commit-log byte before it is fsynced. `flush_count`: fsync rounds
    done so far (one round may fdatasync several files). `on_fsync(seconds)`, when set, is called
    after each successful round with how long it took (the fsync latency metric)."""

    name = "commit-log-flush"

    def __init__(self, commit_log: CommitLog, *, sync_flush: bool, flush_interval_ms: int,
                 sync_flush_timeout_ms: int) -> None:
        super().__init__()
        self._commit_log = commit_log
        self.sync_flush = sync_flush
        self._flush_interval_ms, self._sync_flush_timeout_ms = flush_interval_ms, sync_flush_timeout_ms
        self.flushed_offset = 0
        self.flush_count = 0
        self.on_fsync: Callable[[float], None] | None = None
        # on_error(exc, what) -> remark: a failed fsync makes the store refuse sends (DiskGuard)
        self.on_error: Callable[[OSError, str], str] | None = None
        # (end_offset, future, value, deadline in loop time), in commit-log order
        self._waiters: list[tuple[int, Settable[Any], Any, float]] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._flushing = False          # a round is in its fsync: it wakes itself when done
        # SYNC_FLUSH while running: the long-lived fsync thread, whether a round is out, and the
        # `flush()` calls waiting for a round to reach their target
        self._fsync_thread: FsyncRounds | None = None
        self._round_out = False
        self._flush_calls: list[tuple[int, asyncio.Future[None]]] = []
        # the loop while started: asyncio.get_running_loop() is a getpid syscall on CPython 3.11
        # (its fork check), which every SYNC_FLUSH send paid (~1 µs here, 8 % of a py-spy profile)
        self._loop: asyncio.AbstractEventLoop | None = None

    def begin(self, flushed_offset: int) -> None:
        """Set the recovered position (everything before it is on disk)."""
        self.flushed_offset = flushed_offset

    async def wait_flushed(self, end_offset: int) -> None:
        """Return once the commit log is fsynced up to `end_offset` (SYNC_FLUSH; at once for
        ASYNC_FLUSH). Raises `FlushDiskTimeoutError` after `sync_flush_timeout_ms`."""
        if not self.sync_flush or end_offset <= self.flushed_offset:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.resolve_when_flushed(end_offset, waiter, None)
        await waiter

    def resolve_when_flushed(self, end_offset: int, future: Settable[T], value: T) -> None:
        """`future.set_result(value)` once the commit log is fsynced up to `end_offset`; its
        exception is `FlushDiskTimeoutError` after `sync_flush_timeout_ms`, or the store's
        write error. No task, coroutine or timer per waiter: the send path hands over the future
        its response resolves (the dispatcher writes it from the future's callback), and one
        timer watches the oldest waiter's deadline (waiters are in commit-log order, so the oldest
        is the first to expire)."""
        loop = self._loop
        if loop is None:        # not started (the store's last flush, tests)
            loop = asyncio.get_running_loop()
        deadline = loop.time() + self._sync_flush_timeout_ms / 1000
        self._waiters.append((end_offset, future, value, deadline))
        if self._deadline_timer is None:
            self._deadline_timer = loop.call_at(deadline, self._expire_waiters)
        if self._fsync_thread is not None:
            if not self._round_out:
                self._start_round()
        elif not self._flushing:
            self.wakeup()

    def appended(self, end: int) -> None:
        """The log grew to `end` (every put): a round under way may go on back to back up to it
        (the C fsync thread is told; the Python one reads the log's end itself). A round is not
        started here, ahead of the sender's waiter: on this 2-CPU machine an fsync running beside
        the rest of the put delayed the held pulls it wakes (wake p99 0.5 -> 0.9-1.0 ms) and bought
        durable batches 2-6 %, measured."""
        if self._fsync_thread is not None:
            self._fsync_thread.note_end(end)

    async def start(self) -> None:
        """SYNC_FLUSH: start the fsync thread that every round goes through (the C thread of
        `NativeFsyncThread` when it was built, else `FsyncThread`), then the service (its periodic
        round covers writes nobody waits for)."""
        loop = self._loop = asyncio.get_running_loop()
        if self.sync_flush:
            commit_log = self._commit_log
            if fsync_thread.NativeFsyncWorker is not None:
                self._fsync_thread = NativeFsyncThread(self.name, loop, self._round_done,
                                                       segment_bytes=commit_log.segment_bytes)
            else:
                self._fsync_thread = FsyncThread(
                    self.name, loop, self._round_done, end=lambda: commit_log.max_offset,
                    segment_bytes=commit_log.segment_bytes,
                    sync=lambda paths: fdatasync_paths(paths))   # looked up per round (tests replace it)
            self._fsync_thread.start()
        await super().start()

    async def stop(self) -> None:
        """Stop the service and the fsync thread (the round under way completes first); later
        `flush()` calls (the store's last one) fsync in a worker thread."""
        await super().stop()
        thread, self._fsync_thread = self._fsync_thread, None
        if thread is not None:
            await thread.stop(self.stop_timeout_ms)
        if self._flush_calls:       # asked for while the thread stopped (it takes no new request)
            await self._flush_in_worker()
            calls, self._flush_calls = self._flush_calls, []
            for _, done in calls:
                if not done.done():
                    done.set_result(None)
        self._loop = None

    async def run(self) -> None:
        while await self.wait(self._flush_interval_ms):
            await self.flush()

    async def flush(self) -> None:
        """fsync everything written so far (one round; no-op when nothing is new) and resolve the
        waiters it covers. Called by the loop, and by the store's stop after the loop ended.
        Returns once the round is done, also when its fsync failed (logged; waiters failed)."""
        if self._fsync_thread is None:
            await self._flush_in_worker()
            return
        target = self._commit_log.max_offset
        if target <= self.flushed_offset:
            self._resolve_waiters()
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_calls.append((target, done))
        if not self._round_out:
            self._start_round()
        await done

    def _start_round(self) -> None:
        """Ask the fsync thread for everything written so far (SYNC_FLUSH, no round out)."""
        assert self._fsync_thread is not None
        target = self._commit_log.max_offset
        if target <= self.flushed_offset:
            self._resolve_waiters()
            return
        self._round_out = True
        self._fsync_thread.request(target, self._commit_log.flush_paths(self.flushed_offset, target))

    def _round_done(self, target: int, seconds: float | None, error: OSError | None) -> None:
        """On the loop, after the fsync thread's round up to `target` (`seconds` None: covered by
        an earlier round, no fsync of its own)."""
        self._round_out = False
        if error is not None:
            self._round_failed(error, target)
        else:
            self.flushed_offset = max(self.flushed_offset, target)
            if seconds is not None:
                self.flush_count += 1
                if self.on_fsync is not None:
                    self.on_fsync(seconds)
            self._resolve_waiters()
        calls, self._flush_calls = self._flush_calls, []
        for call_target, done in calls:
            if error is None and call_target > self.flushed_offset:
                self._flush_calls.append((call_target, done))
            elif not done.done():
                done.set_result(None)
        if (self._waiters or self._flush_calls) and self._fsync_thread is not None and not self._round_out:
            self._start_round()

    def _round_failed(self, exc: OSError, target: int) -> None:
        log.error("commit log fsync failed", exc_info=exc)
        if self.on_error is not None:     # ENOSPC/EIO: refuse sends until space is back
            self._fail_waiters(StoreNotWritableError(self.on_error(exc, "commit-log fsync")))
        else:
            self._fail_waiters(FlushDiskTimeoutError(target, f"fsync failed: {exc}"))

    async def _flush_in_worker(self) -> None:
        """One round in a worker thread: ASYNC_FLUSH's periodic flush, and any flush while the
        fsync thread is not running."""
        target = self._commit_log.max_offset
        if target > self.flushed_offset:
            paths = self._commit_log.flush_paths(self.flushed_offset, target)
            started = time.perf_counter()
            self._flushing = True
            try:
                await asyncio.to_thread(fdatasync_paths, paths)
            except OSError as exc:
                self._round_failed(exc, target)
                return
            finally:
                self._flushing = False
            self.flushed_offset = max(self.flushed_offset, target)
            self.flush_count += 1
            if self.on_fsync is not None:
                self.on_fsync(time.perf_counter() - started)
        self._resolve_waiters()

    def _resolve_waiters(self) -> None:
        waiters = self._waiters
        if not waiters:
            return
        flushed = self.flushed_offset
        done = 0
        for end_offset, future, value, _ in waiters:
            if end_offset > flushed:
                break
            if not future.done():
                future.set_result(value)
            done += 1
        del waiters[:done]
        if waiters and self._fsync_thread is None:   # written after this round started: next round
            self.wakeup()

    def _expire_waiters(self) -> None:
        """The deadline timer: fail every waiter past `sync_flush_timeout_ms`, then re-arm for the
        oldest one left."""
        self._deadline_timer = None
        waiters = self._waiters
        if not waiters:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        expired = 0
        for end_offset, future, value, deadline in waiters:
            if deadline > now:
                break
            if not future.done():
                timeout_ms = self._sync_flush_timeout_ms
                future.set_exception(FlushDiskTimeoutError(end_offset, f"not flushed within {timeout_ms} ms", value))
            expired += 1
        del waiters[:expired]
        if waiters:
            self._deadline_timer = loop.call_at(waiters[0][3], self._expire_waiters)

    def _fail_waiters(self, error: FlushDiskTimeoutError | StoreNotWritableError) -> None:
        waiters, self._waiters = self._waiters, []
        for _, future, _, _ in waiters:
            if not future.done():
                future.set_exception(error)


async def flush_consume_queues(consume_queues: ConsumeQueueTable, *, reput_offset: int,
                               commit_log_flushed_offset: int, written_at_ms: int, checkpoint_path: Path) -> None:
    """fsync the consume-queue files written since the last call, then write the checkpoint. The
    caller captures `reput_offset` in the same loop step as this call starts, so the queue maxima
    and dirty ranges taken here (before the fsync) cover every unit below it."""
    queue_max_offsets: dict[tuple[str, int], int] = {}
    flushed: list[tuple[ConsumeQueue, int]] = []
    paths: list[Path] = []
    for key, queue in consume_queues.queues.items():
        queue_max_offsets[key] = queue.max_offset
        end_bytes, queue_paths = queue.dirty_range()
        if queue_paths:
            flushed.append((queue, end_bytes))
            paths.extend(queue_paths)
    await asyncio.to_thread(fdatasync_paths, paths)
    for queue, end_bytes in flushed:
        queue.mark_flushed(end_bytes)
    checkpoint = Checkpoint(commit_log_flushed_offset=commit_log_flushed_offset, reput_offset=reput_offset,
                            written_at_ms=written_at_ms, queue_max_offsets=queue_max_offsets)
    await asyncio.to_thread(write_checkpoint, checkpoint_path, checkpoint)
