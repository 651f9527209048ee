"""`FsyncThread`: one long-lived thread that fdatasyncs commit-log files for the event loop
(RocketMQ's `GroupCommitService` thread), so a SYNC_FLUSH round costs a condition-variable wake-up
and one `call_soon_threadsafe`, not an executor work item, its future and its chained loop future
(`asyncio.to_thread`: ~12 µs more CPU a round, measured).

The loop asks for a round with `request(target, paths)`; a request made while the thread is busy
replaces any request not yet taken (the newest covers the older, as the commit log only grows).
Each round's outcome is reported on the loop as `on_done(target, seconds, error)`.

Back to back: after a round, when the log has grown (`end()`) inside the round's last file, the
thread starts the next round at once, without waiting for the loop to take the report and ask
again (RocketMQ's group-commit thread likewise flushes while requests keep coming). The loop
picking up a report can wait for the callback it is running: skipping that hop took a busy
round's cycle from ~0.75 to ~0.5 ms."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from broker.store.segment import fdatasync_paths
from protocol import native

log = logging.getLogger(__name__)


_fsync = native.load("broker.store._fsync")
NativeFsyncWorker: Any = _fsync.FsyncWorker if _fsync is not None else None
"""The C fsync thread class, or None (not built, or RQ_PURE_PYTHON set): `NativeFsyncThread` needs it."""

RoundDone = Callable[[int, float | None, OSError | None], None]
"""`on_done(target, seconds, error)`: the round up to `target` took `seconds` of fdatasync (None: no
fsync was needed, an earlier back-to-back round covered `target`); `error` is the OSError it raised
(nothing before `target` is then known to be durable)."""


class FsyncRounds(Protocol):
    """What the flush service needs of an fsync thread (`FsyncThread` or `NativeFsyncThread`)."""

    def start(self) -> None: ...

    def request(self, target: int, paths: list[Path]) -> None: ...

    def note_end(self, end: int) -> None: ...

    async def stop(self, timeout_ms: int) -> None: ...


class FsyncThread:
    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, on_done: RoundDone, *, end: Callable[[], int],
                 segment_bytes: int, sync: Callable[[list[Path]], None] = fdatasync_paths) -> None:
        self._loop, self._on_done, self._sync = loop, on_done, sync
        self._end, self._segment_bytes = end, segment_bytes   # the log's write position; file size
        self._synced = 0            # every byte before this was covered by a round that succeeded
        self._wake = threading.Condition()
        self._request: tuple[int, list[Path]] | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def request(self, target: int, paths: list[Path]) -> None:
        """fdatasync `paths` (the files holding commit-log bytes up to `target`) next."""
        with self._wake:
            self._request = (target, paths)
            self._wake.notify()

    def note_end(self, end: int) -> None:
        """The log grew to `end` (this thread reads `end()` itself when a round ends: nothing to do)."""

    async def stop(self, timeout_ms: int) -> None:
        """Finish the round under way, or the one requested and not yet begun (the loop counts it
        as out: its `on_done` is still delivered), take no other, and end the thread; waits at
        most `timeout_ms` (a hung disk leaves the daemon thread behind)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        await asyncio.to_thread(self._thread.join, timeout_ms / 1000)
        if self._thread.is_alive():
            log.warning("%s: an fsync is still running after %d ms; leaving it", self._thread.name, timeout_ms)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._request is None and not self._stopping:
                    self._wake.wait()
                if self._request is None:   # stopping, with no round asked for (one asked for is run)
                    return
                target, paths = self._request
                self._request = None
            next_target: int | None = target
            while next_target is not None:
                synced = self._round(next_target, paths)
                if synced is None:
                    return
                next_target = self._next_target(next_target) if synced else None
                paths = paths[-1:]

    def _round(self, target: int, paths: list[Path]) -> bool | None:
        """One fsync round, reported to the loop: True when it succeeded, False when it failed
        (the loop is told; the thread waits for the next request), None when the loop is gone."""
        seconds: float | None = None
        error: OSError | None = None
        if target > self._synced:       # else an earlier back-to-back round covered it
            started = time.perf_counter()
            try:
                self._sync(paths)
            except OSError as exc:
                error = exc
            else:
                self._synced = target
            seconds = time.perf_counter() - started
        try:
            self._loop.call_soon_threadsafe(self._on_done, target, seconds, error)
        except RuntimeError:            # the loop is closed: nobody is waiting any more
            return None
        return error is None

    def _next_target(self, target: int) -> int | None:
        """The end of a back-to-back round after one up to `target`: the log's end when it grew
        within the same file and no stop or newer request is waiting; else None. Reads one int
        (`end()`): no list the loop changes is walked from here."""
        end = self._end()
        if end <= target or self._stopping or self._request is not None:
            return None
        segment_bytes = self._segment_bytes
        return end if (end - 1) // segment_bytes == (target - 1) // segment_bytes else None


class NativeFsyncThread:
    """`FsyncThread`'s rounds on `broker.store._fsync.FsyncWorker`, a C thread that never takes the
    GIL: it waits, opens, fdatasyncs and closes the round's files, and wakes the loop through a
    pipe (`loop.add_reader`), which then takes the finished rounds and reports each as
    `on_done(target, seconds, error)`. The Python thread needs the GIL before and after each
    fdatasync, so every round also waited for the busy loop to let go of it, twice.

    The back-to-back rounds need the log's end as it grows: the flush service passes it on with
    `note_end` after every append. `inject(delay_ms, errno)` makes the disk slow or failing (tests)."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, on_done: RoundDone, *,
                 segment_bytes: int) -> None:
        self.name = name
        self._loop, self._on_done = loop, on_done
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._worker = NativeFsyncWorker(self._write_fd, segment_bytes)
        self._reading = False
        self._closed = False

    def start(self) -> None:
        self._worker.start()
        self._loop.add_reader(self._read_fd, self._wakeup)
        self._reading = True

    def request(self, target: int, paths: list[Path]) -> None:
        """fdatasync `paths` (the files holding commit-log bytes up to `target`) next."""
        self._worker.note_end(target)
        self._worker.request(target, [os.fsencode(path) for path in paths])

    def note_end(self, end: int) -> None:
        """The log's write position is now `end` (a back-to-back round may go up to it)."""
        self._worker.note_end(end)

    def inject(self, delay_ms: int, error: int = 0) -> None:
        """Tests: each later fsync first waits `delay_ms`, then fails with `error` unless it is 0."""
        self._worker.inject(delay_ms, error)

    def _wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._read_fd, 4096)        # more left (a burst of rounds): called again
        for target, seconds, error in self._worker.take():
            self._on_done(target, None if seconds < 0 else seconds,
                          OSError(error, os.strerror(error)) if error else None)

    async def stop(self, timeout_ms: int) -> None:
        """Finish the round under way, or the one requested and not yet begun (its `on_done` is
        still delivered), take no other, and end the thread; waits at most `timeout_ms` (a hung
        disk leaves the thread behind)."""
        if self._closed:
            return
        joined = await asyncio.to_thread(self._worker.stop, timeout_ms)
        if self._reading:
            self._loop.remove_reader(self._read_fd)
            self._reading = False
        if joined:
            self._wakeup()          # the rounds finished since the last wake-up
            os.close(self._read_fd)
            os.close(self._write_fd)
        else:
            log.warning("%s: an fsync is still running after %d ms; leaving it", self.name, timeout_ms)
        self._closed = True
