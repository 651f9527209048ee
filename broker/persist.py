"""State files under `<store>/config/`: strict JSON written atomically (temp file, fsync, rename,
fsync of the directory), PROTOCOL.md deliberate difference 6 (RocketMQ writes fastjson with
unquoted integer keys).

Two kinds of state:
- `DurableTable` (topic and subscription-group configs): every change is written at once, in a
  worker thread, concurrent changes coalesced into one write; a request that made a change awaits
  `wait_durable` before it is answered (RocketMQ persists these synchronously on the request
  thread, `TopicConfigManager#updateTopicConfig` → `persist()`).
- `DirtyState` (committed offsets, delay offsets): written every `persist_interval_ms` when
  changed, and at a clean stop; a kill -9 loses at most the last interval's changes (RocketMQ's
  `flushConsumerOffsetInterval`, 5 s). A consumer then re-consumes from the older offset.
Both write files in a worker thread; the loop only takes the snapshot."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from protocol.atomic import write_bytes_atomic
from protocol.errors import ServiceNotAvailable
from protocol.service import Service

log = logging.getLogger(__name__)


def write_json_atomic(path: Path, value: Any) -> None:
    """Write `value` as JSON to `path` so that a reader sees the old or the new file, never a torn one."""
    write_bytes_atomic(path, json.dumps(value, indent=1, sort_keys=True, allow_nan=False).encode())


def read_json(path: Path) -> Any | None:
    """The JSON value in `path`, or None when the file does not exist. A file that is not valid
    JSON raises `ValueError` naming it: the broker refuses to start rather than lose state."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"state file {path} is not valid JSON: {exc}") from exc


class DirtyState:
    """Base of the managers persisted by `ConfigPersistService`: `dirty` says the file is stale."""

    def __init__(self) -> None:
        self._dirty = False

    def touch(self) -> None:
        self._dirty = True

    @property
    def dirty(self) -> bool:
        return self._dirty

    def mark_clean(self) -> None:
        self._dirty = False


Render = Callable[[], bytes]
"""A snapshot of a `DurableTable` taken on the loop, turned into the file's bytes in a worker thread."""
Durable = Callable[[Exception | None], None]
"""Told once changes are on disk (None) or could not be written (the `ServiceNotAvailable`)."""


class DurableTable(DirtyState):
    """Base of a manager whose state is one JSON object `{table_key: {key: entry}, **extra}` written
    atomically at once after every change (`changed(key)`), in a worker thread, with concurrent
    changes coalesced into one write. Subclasses keep each entry's JSON text in `lines` (through
    `set_line` / `drop_line`), so a snapshot on the loop is a list of strings (~1 ms for 100,000
    entries) and the serialization left for the thread is a join: a change never blocks the loop
    for the size of the table (a synchronous save of 100,000 topics blocked it ~1 s).

    `is_durable(key)` says whether every change of `key` is on disk; `when_durable(key, done)`
    calls `done` once it is, and `wait_durable(key)` returns then; a failed write gives them a
    `ServiceNotAvailable` naming the file and the error, and the change stays in memory, written
    again with the next change or wait. Nothing is written before `bind(path)` (a manager used
    alone, in tests)."""

    file_name: str
    table_key: str

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, str] = {}
        self._path: Path | None = None
        self._generation = 0                    # bumped by every change
        self._durable_generation = 0            # every change up to this one is on disk
        self._unsaved: dict[str, int] = {}      # key → generation of its newest change not on disk
        self._waiters: list[tuple[int, Durable]] = []        # (generation, done), in call order
        self._writer: asyncio.Task[None] | None = None
        self._failing = False                   # the last write failed (logged once until one succeeds)
        self.writes = 0                         # files written: one per change, or one for many at once

    def bind(self, path: Path) -> None:
        self._path = path

    @staticmethod
    def line_of(key: str, entry: dict[str, Any]) -> str:
        """`key`'s line of the file (for `lines`, also when loading)."""
        return f"  {json.dumps(key)}: {json.dumps(entry, sort_keys=True, allow_nan=False)}"

    def set_line(self, key: str, entry: dict[str, Any]) -> None:
        """Record `key`'s new entry (a JSON object) and write it out."""
        self.lines[key] = self.line_of(key, entry)
        self.changed(key)

    def drop_line(self, key: str) -> None:
        self.lines.pop(key, None)
        self.changed(key)

    def extra_json(self) -> dict[str, Any]:
        """Small top-level values written beside the table (a copy: it is rendered in a thread)."""
        return {}

    def changed(self, key: str) -> None:
        self._generation += 1
        self._unsaved[key] = self._generation
        self.touch()
        self._start_writer()

    @property
    def generation(self) -> int:
        """Bumped by every change (a replication stream sends the table again when it moved)."""
        return self._generation

    def is_durable(self, key: str) -> bool:
        return key not in self._unsaved

    @property
    def all_durable(self) -> bool:
        return not self._unsaved

    def when_durable(self, key: str | None, done: Durable) -> None:
        """`done(None)` once `key`'s changes (every change when None) are on disk: now when they
        are, else on the loop, inside the step that finished the write, after the `done`s
        registered before it (so sends waiting for a new topic are stored in the order they came),
        or `done(error)` when that write failed."""
        target = self._generation if key is None else self._unsaved.get(key, 0)
        if target <= self._durable_generation or self._path is None:
            done(None)
            return
        self._waiters.append((target, done))
        self._start_writer()

    async def wait_durable(self, key: str | None = None) -> None:
        """Return once `key`'s changes (every change when None) are on disk; raises
        `ServiceNotAvailable` when the write covering them failed."""
        if key is not None and self.is_durable(key):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(error: Exception | None) -> None:
            if not waiter.done():
                waiter.set_result(None) if error is None else waiter.set_exception(error)
        self.when_durable(key, done)
        await waiter

    def snapshot(self) -> Render:
        lines, extra, table_key = list(self.lines.values()), self.extra_json(), self.table_key
        return lambda: render_table(table_key, lines, extra)

    def to_json(self) -> Any:
        return json.loads(self.snapshot()())

    def write_now(self) -> None:
        """Write the whole table synchronously (a clean stop, once `settle` returned)."""
        if self._path is not None:
            target = self._generation
            write_bytes_atomic(self._path, self.snapshot()())
            self._written(target)

    async def settle(self) -> None:
        """Wait for the write under way, if any (its failure is logged, not raised)."""
        writer = self._writer
        if writer is not None:
            await asyncio.wait({writer})

    def _start_writer(self) -> None:
        if self._path is None or (self._writer is not None and not self._writer.done()):
            return
        if self._durable_generation >= self._generation:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:            # no loop (a tool editing state offline): `write_now` at the end
            return
        self._writer = loop.create_task(self._write_changes(), name=f"write-{self.file_name}")

    async def _write_changes(self) -> None:
        path = self._path
        assert path is not None
        while self._durable_generation < self._generation:
            target = self._generation
            render = self.snapshot()            # same loop step as `target`: covers every change to it
            try:
                await asyncio.to_thread(_render_and_write, path, render)
            except Exception as exc:        # ENOSPC, EIO, ...: every waiter is told, none hangs
                self._write_failed(path, exc)
                return
            self._written(target)

    def retry_write(self) -> None:
        """Write the changes a failed write left in memory (the periodic persist round)."""
        self._start_writer()

    def _write_failed(self, path: Path, exc: Exception) -> None:
        (log.debug if self._failing else log.error)(
            "could not write %s (%s); %d changes kept in memory, written with the next change",
            path, exc, len(self._unsaved))
        self._failing = True
        reason = (f"{errno.errorcode.get(exc.errno or 0, 'error')} ({exc.strerror or exc})"
                  if isinstance(exc, OSError) else f"{exc.__class__.__name__}: {exc}")
        error = ServiceNotAvailable(f"the change could not be made durable: writing {path.name} failed "
                                    f"with {reason}; the broker keeps it in memory; try again later")
        waiters, self._waiters = self._waiters, []
        _tell([done for _, done in waiters], error)

    def _written(self, target: int) -> None:
        self.writes += 1
        if self._failing:
            log.warning("%s written again", self.file_name)
            self._failing = False
        self._durable_generation = max(self._durable_generation, target)
        self._unsaved = {key: generation for key, generation in self._unsaved.items() if generation > target}
        if not self._unsaved:
            self.mark_clean()
        ready = [done for generation, done in self._waiters if generation <= target]
        self._waiters = [(generation, done) for generation, done in self._waiters if generation > target]
        _tell(ready, None)


def _tell(waiters: list[Durable], error: Exception | None) -> None:
    for done in waiters:
        try:
            done(error)
        except Exception:
            log.exception("a caller waiting for a config write failed")


def render_table(table_key: str, lines: list[str], extra: dict[str, Any]) -> bytes:
    """`{table_key: {...lines...}, **extra}` as JSON text, one entry per line. Pure."""
    parts = ["{\n", f" {json.dumps(table_key)}: {{\n", ",\n".join(lines), "\n }"]
    for name, value in extra.items():
        parts.append(f",\n {json.dumps(name)}: {json.dumps(value, sort_keys=True)}")
    parts.append("\n}\n")
    return "".join(parts).encode()


def _render_and_write(path: Path, render: Render) -> None:
    write_bytes_atomic(path, render())


class Persistent(Protocol):
    """A manager whose state is one JSON file."""

    file_name: str

    @property
    def dirty(self) -> bool: ...

    def to_json(self) -> Any: ...

    def load_json(self, value: Any) -> None: ...

    def mark_clean(self) -> None: ...

    def touch(self) -> None: ...


class ConfigPersistService(Service):
    """Every `interval_ms` (and at stop), writes each dirty manager's file under `config_dir`; the
    `DurableTable`s among them write themselves at each change, and here only retry a failed write
    and write once more at stop."""

    name = "config-persist"

    def __init__(self, config_dir: Path, managers: Sequence[Persistent], interval_ms: int,
                 write: Callable[[Path, Any], None] = write_json_atomic) -> None:
        super().__init__()
        self._dir, self._managers, self._interval_ms, self._write = config_dir, managers, interval_ms, write

    def load(self) -> None:
        """Read every manager's file (a missing file leaves the manager empty); `DurableTable`s
        write to theirs from now on."""
        for manager in self._managers:
            path = self._dir / manager.file_name
            value = read_json(path)
            if value is not None:
                manager.load_json(value)
                manager.mark_clean()
            if isinstance(manager, DurableTable):
                manager.bind(path)

    def persist_all(self, *, force: bool = False) -> None:
        """Write each dirty manager's file now, on the caller's thread (every one with `force`). A
        file that cannot be written (a full disk) is logged and the others are still written;
        the last error is raised at the end (`OSError`)."""
        failed: OSError | None = None
        for manager in self._managers:
            try:
                if isinstance(manager, DurableTable):
                    if force or not manager.all_durable:
                        manager.write_now()
                elif manager.dirty or force:
                    manager.mark_clean()
                    self._write(self._dir / manager.file_name, manager.to_json())
            except OSError as exc:
                log.error("could not persist %s to %s: %s", manager.file_name, self._dir, exc)
                manager.touch()
                failed = exc
        if failed is not None:
            raise failed

    async def persist_changed(self) -> None:
        """One periodic round: each dirty manager's snapshot taken here, written in a worker thread
        (a failed write keeps it dirty for the next round); a `DurableTable` with unwritten
        changes (its last write failed) writes them again."""
        for manager in self._managers:
            if isinstance(manager, DurableTable):
                if not manager.all_durable:
                    manager.retry_write()
                continue
            if not manager.dirty:
                continue
            manager.mark_clean()
            value = manager.to_json()
            try:
                await asyncio.to_thread(self._write, self._dir / manager.file_name, value)
            except OSError:
                log.exception("could not persist %s to %s; will retry", manager.file_name, self._dir)
                manager.touch()

    async def run(self) -> None:
        while await self.wait(self._interval_ms):
            await self.persist_changed()
        await self._settle()
        self.persist_all(force=True)

    async def stop(self) -> None:
        """Stop the periodic writes (the last one writes everything), then wait for any write a
        `DurableTable` still has under way (also when the service never started)."""
        await super().stop()
        await self._settle()

    async def _settle(self) -> None:
        for manager in self._managers:
            if isinstance(manager, DurableTable):
                await manager.settle()
