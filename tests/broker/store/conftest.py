"""Store fixtures: a started `MessageStore` on `tmp_path` with small files (64 KiB commit-log
segments, 100 units per consume-queue file) and a clock the test moves."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import broker.store.flush as flush_module
from broker.store.fsync_thread import NativeFsyncThread
from broker.store.message_store import MessageStore
from broker.store.results import GetMessageResult, PutMessageResult
from broker.store.segment import fdatasync_paths
from conf.store import StoreConfig
from protocol.message import MessageExt, decode_message_batch

STORE_HOST = "10.0.0.1:10911"
BORN_HOST = "10.0.0.2:50000"


class TickClock:
    """Wall clock for store timestamps: returns `now_ms`, which tests set."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def small_config(path: Path, **overrides: Any) -> StoreConfig:
    fields: dict[str, Any] = {"path": path, "commit_log_segment_bytes": 64 * 1024,
                              "consume_queue_segment_units": 100, "flush_consume_queue_interval_ms": 60_000}
    fields.update(overrides)
    return StoreConfig(**fields)


@pytest.fixture
def clock() -> TickClock:
    return TickClock()


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return small_config(tmp_path / "store")


@pytest.fixture
async def store(config: StoreConfig, clock: TickClock) -> AsyncIterator[MessageStore]:
    running = MessageStore(config, store_host=STORE_HOST, clock_ms=clock)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


async def open_store(config: StoreConfig, clock: Callable[[], int] | None = None) -> MessageStore:
    store = MessageStore(config, store_host=STORE_HOST, clock_ms=clock or TickClock())
    await store.start()
    return store


async def crash(store: MessageStore) -> None:
    """Stop like a `kill -9`: no final flush, no checkpoint, the `abort` marker stays. Page-cache
    contents survive, as they do when only the process dies."""
    await store._shutdown(clean=False)


def put(store: MessageStore, topic: str = "t", queue_id: int = 0, body: bytes = b"x", *,
        tags: str | None = None, properties: dict[str, str] | None = None) -> PutMessageResult:
    props = dict(properties or {})
    if tags is not None:
        props["TAGS"] = tags
    result = store.put_message(topic=topic, queue_id=queue_id, body=body, properties=props, flag=0,
                               born_timestamp=1, born_host=BORN_HOST)
    assert result.ok, result
    return result


def put_many(store: MessageStore, count: int, topic: str = "t", queue_id: int = 0,
             body_of: Callable[[int], bytes] = lambda i: f"m{i}".encode(), **kwargs: Any) -> None:
    for index in range(count):
        put(store, topic, queue_id, body_of(index), **kwargs)
    store.dispatch_available()


def decoded(result: GetMessageResult) -> list[MessageExt]:
    return decode_message_batch(b"".join(result.messages))


def bodies(result: GetMessageResult) -> list[bytes]:
    return [m.body for m in decoded(result)]


@dataclasses.dataclass
class TagFilter:
    """A TAG subscription: matches by tags_code only."""

    codes: set[int]
    needs_properties: bool = False
    commit_log_calls: int = 0

    def match_by_consume_queue(self, tags_code: int) -> bool:
        return tags_code in self.codes

    def match_by_commit_log(self, properties: dict[str, str] | None) -> bool:
        self.commit_log_calls += 1
        return True


@dataclasses.dataclass
class PropertyFilter:
    """An SQL-like subscription: `key = value` on the properties."""

    key: str
    value: str
    needs_properties: bool = True

    def match_by_consume_queue(self, tags_code: int) -> bool:
        return True

    def match_by_commit_log(self, properties: dict[str, str] | None) -> bool:
        return properties is not None and properties.get(self.key) == self.value


async def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Bounded wait for a condition another task makes true."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.002)


class Disk:
    """A slow or failing disk under either fsync thread: the Python one's fsync function is
    replaced, the C one is told through its test hook (`inject`)."""

    def __init__(self, store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self._thread = store._commit_log_flush._fsync_thread
        self._monkeypatch = monkeypatch
        self.threads: set[int] = set()        # where the Python thread's fsyncs ran

    def _python(self, delay_ms: int, error: int) -> None:
        def fsync(paths: list[Path]) -> None:
            self.threads.add(threading.get_ident())
            time.sleep(delay_ms / 1000)
            if error:
                raise OSError(error, os.strerror(error))
            fdatasync_paths(paths)
        self._monkeypatch.setattr(flush_module, "fdatasync_paths", fsync)

    def slow(self, delay_ms: int) -> None:
        if isinstance(self._thread, NativeFsyncThread):
            self._thread.inject(delay_ms, 0)
        else:
            self._python(delay_ms, 0)

    def fail(self, error: int) -> None:
        if isinstance(self._thread, NativeFsyncThread):
            self._thread.inject(0, error)
        else:
            self._python(0, error)

    def heal(self) -> None:
        if isinstance(self._thread, NativeFsyncThread):
            self._thread.inject(0, 0)
        else:
            self._monkeypatch.undo()
