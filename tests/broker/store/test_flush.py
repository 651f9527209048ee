"""SYNC_FLUSH group commit, its timeout, ASYNC_FLUSH, and the consume-queue checkpoint."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import broker.store.flush as flush_module
from broker.store.checkpoint import read_checkpoint
from broker.store.message_store import MessageStore
from broker.store.results import FlushDiskTimeoutError, PutMessageStatus, StoreNotWritableError
from tests.broker.store.conftest import eventually, open_store, put, small_config


async def send(store: MessageStore, body: bytes = b"x") -> int:
    result = put(store, body=body)
    await store.wait_flushed(result.end_offset)
    return result.end_offset


async def test_sync_flush_waits_for_fsync(store: MessageStore) -> None:
    before = store.flush_count
    end = await asyncio.wait_for(send(store), timeout=5)
    assert store.flush_count == before + 1
    assert store._commit_log_flush.flushed_offset >= end
    await asyncio.wait_for(store.wait_flushed(end), timeout=1)       # already flushed: no new fsync
    assert store.flush_count == before + 1


async def test_concurrent_sends_share_fsyncs(store: MessageStore) -> None:
    before = store.flush_count
    ends = await asyncio.wait_for(asyncio.gather(*(send(store, b"%d" % i) for i in range(50))), timeout=5)
    assert store._commit_log_flush.flushed_offset >= max(ends)
    assert store.flush_count - before <= 2          # one group commit (two if one was in flight)


async def test_fsync_runs_off_the_event_loop(store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    release, entered = threading.Event(), threading.Event()
    loop_thread = threading.get_ident()

    def slow_fdatasync(paths: list[Path]) -> None:
        assert threading.get_ident() != loop_thread
        entered.set()
        assert release.wait(5)

    monkeypatch.setattr(flush_module, "fdatasync_paths", slow_fdatasync)
    waiting = asyncio.create_task(send(store))
    await eventually(entered.is_set)
    assert not waiting.done()                         # the loop runs while fsync blocks
    release.set()
    await asyncio.wait_for(waiting, timeout=5)


async def test_sync_flush_timeout_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await open_store(small_config(tmp_path, sync_flush_timeout_ms=50))
    release = threading.Event()
    monkeypatch.setattr(flush_module, "fdatasync_paths", lambda paths: release.wait(5))
    try:
        with pytest.raises(FlushDiskTimeoutError) as raised:
            await asyncio.wait_for(send(store), timeout=5)
        assert raised.value.code.name == "FLUSH_DISK_TIMEOUT"
    finally:
        release.set()
        await store.stop()


async def test_failed_fsync_fails_the_waiters_and_refuses_sends_until_writable(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(paths: list[Path]) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(flush_module, "fdatasync_paths", broken)
    with pytest.raises(StoreNotWritableError, match="fsync failed with EIO"):
        await asyncio.wait_for(send(store), timeout=5)
    # then sends are refused, saying why, until a disk check finds the store writable again
    refused = store.put_message(topic="t", queue_id=0, body=b"x", properties={}, flag=0, born_timestamp=1,
                                born_host="10.0.0.2:1")
    assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "EIO" in refused.remark
    monkeypatch.undo()
    await store.check_disk()
    await asyncio.wait_for(send(store), timeout=5)


async def test_async_flush_acknowledges_at_once_and_flushes_on_interval(tmp_path: Path) -> None:
    store = await open_store(small_config(tmp_path, flush_disk_type="ASYNC_FLUSH", flush_interval_ms=20))
    try:
        before = store.flush_count
        end = put(store).end_offset
        await asyncio.wait_for(store.wait_flushed(end), timeout=0.5)
        assert store._commit_log_flush.flushed_offset < end           # acknowledged before the fsync
        await eventually(lambda: store._commit_log_flush.flushed_offset >= end)
        assert store.flush_count > before
    finally:
        await store.stop()


async def test_consume_queues_flush_then_checkpoint(tmp_path: Path) -> None:
    store = await open_store(small_config(tmp_path, flush_consume_queue_interval_ms=20))
    try:
        put(store)
        end = put(store).end_offset
        await eventually(lambda: (c := read_checkpoint(tmp_path / "checkpoint")) is not None
                         and c.reput_offset == end and c.queue_max_offsets == {("t", 0): 2})
    finally:
        await store.stop()
