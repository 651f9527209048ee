"""Restart and recovery: clean stop, crash, torn tails, lagging consume queues, a real kill -9."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from broker.store.message_store import MessageStore
from broker.store.results import GetMessageStatus
from conf.store import StoreConfig
from tests.broker.store.conftest import bodies, crash, open_store, put, put_many, small_config


def all_bodies(store: MessageStore, topic: str = "t", queue_id: int = 0) -> list[bytes]:
    got: list[bytes] = []
    queue_offset = store.get_min_offset(topic, queue_id)
    while (result := store.get_message(topic, queue_id, queue_offset, 32, None)).status in (
            GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
        got += bodies(result)
        queue_offset = result.next_begin_offset
    return got


def expected(count: int, start: int = 0) -> list[bytes]:
    return [f"m{i}".encode() for i in range(start, start + count)]


def last_segment(config: StoreConfig) -> Path:
    return sorted((config.path / "commitlog").iterdir())[-1]


async def test_restart_after_clean_stop_continues_offsets(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 300)                   # rolls commit-log segments and consume-queue files
    end = store.commit_log_max_offset()
    await store.stop()
    store = await open_store(config)
    try:
        assert store.commit_log_max_offset() == end and store.get_max_offset("t", 0) == 300
        result = put(store, body=b"m300")
        assert result.queue_offset == 300 and result.commit_log_offsets[0] >= end
        store.dispatch_available()
        assert all_bodies(store) == expected(301)
    finally:
        await store.stop()


async def test_crash_keeps_every_complete_record(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 250)
    put(store, body=b"m250")              # appended but not yet dispatched when the process dies
    end = store.commit_log_max_offset()
    await crash(store)
    assert (config.path / "abort").exists()
    store = await open_store(config)
    try:
        assert store.commit_log_max_offset() == end
        assert all_bodies(store) == expected(251)
        assert put(store, body=b"m251").queue_offset == 251
        store.dispatch_available()
        assert all_bodies(store)[-2:] == [b"m250", b"m251"]
    finally:
        await store.stop()


async def test_garbage_after_the_last_record_is_truncated(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 10)
    end = store.commit_log_max_offset()
    await crash(store)
    (config.path / "checkpoint").unlink(missing_ok=True)
    with open(last_segment(config), "r+b") as file:        # a torn record: header and half a payload
        file.seek(end)
        file.write(b"\x00\x00\x01\x00\xde\xad\xbe\xef" + os.urandom(100))
    store = await open_store(config)
    try:
        assert store.commit_log_max_offset() == end
        assert last_segment(config).read_bytes()[end:end + 200] == bytes(200)
        assert all_bodies(store) == expected(10)
        result = put(store, body=b"m10")
        assert (result.queue_offset, result.commit_log_offsets) == (10, [end])
        store.dispatch_available()
        assert all_bodies(store) == expected(11)
    finally:
        await store.stop()


async def test_a_torn_last_record_and_its_consume_queue_unit_are_dropped(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 5)
    last = put(store, body=b"m5" * 100).commit_log_offsets[0]
    store.dispatch_available()                 # its consume-queue unit exists
    assert store.get_max_offset("t", 0) == 6
    await crash(store)
    with open(last_segment(config), "r+b") as file:         # damage the middle of that record
        file.seek(last + 100)
        file.write(b"\xff\xff")
    store = await open_store(config)
    try:
        assert store.commit_log_max_offset() == last
        assert store.get_max_offset("t", 0) == 5 and all_bodies(store) == expected(5)
        assert store.look_message_by_offset(last) is None
        again = put(store, body=b"m5")
        assert (again.queue_offset, again.commit_log_offsets) == (5, [last])
        store.dispatch_available()
        assert all_bodies(store) == expected(6)
    finally:
        await store.stop()


async def test_deleted_consume_queue_is_rebuilt(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 150, "a")
    put_many(store, 20, "b")
    await store.stop()
    shutil.rmtree(config.path / "consumequeue" / "a")
    store = await open_store(config)
    try:
        assert store.get_max_offset("a", 0) == 150 and all_bodies(store, "a") == expected(150)
        assert all_bodies(store, "b") == expected(20)
        assert put(store, "a", body=b"m150").queue_offset == 150
    finally:
        await store.stop()


async def test_crash_without_checkpoint_rebuilds_lost_consume_queues(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 120, "a")
    put_many(store, 30, "b", 3)
    await crash(store)
    (config.path / "checkpoint").unlink(missing_ok=True)
    shutil.rmtree(config.path / "consumequeue")
    store = await open_store(config)
    try:
        assert all_bodies(store, "a") == expected(120) and all_bodies(store, "b", 3) == expected(30)
        assert put(store, "b", 3).queue_offset == 30
    finally:
        await store.stop()


async def test_restart_without_checkpoint_after_clean_stop(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 40)
    await store.stop()
    (config.path / "checkpoint").unlink()
    calls: list[int] = []
    store = MessageStore(config, store_host="h:1")
    store.set_arrival_listener(lambda topic, queue_id, max_offset, tags, props: calls.append(max_offset))
    await store.start()
    try:
        assert calls == []                  # re-dispatched duplicates notify nobody
        assert all_bodies(store) == expected(40) and put(store).queue_offset == 40
    finally:
        await store.stop()


KILL_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from broker.store.message_store import MessageStore
    from conf.store import StoreConfig

    async def main() -> None:
        config = StoreConfig(path=Path(sys.argv[1]), commit_log_segment_bytes=65536,
                             consume_queue_segment_units=100)
        store = MessageStore(config, store_host="127.0.0.1:1")
        await store.start()
        i = 0
        while True:
            result = store.put_message(topic="k", queue_id=0, body=b"m%d" % i, properties={}, flag=0,
                                       born_timestamp=0, born_host="h:1")
            await store.wait_flushed(result.end_offset)
            print(i, flush=True)
            i += 1

    asyncio.run(main())
""")


async def test_kill_9_loses_no_acknowledged_message(tmp_path: Path) -> None:
    config = small_config(tmp_path / "store")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILL_SCRIPT, str(config.path), stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    acknowledged = -1
    try:
        async with asyncio.timeout(30):
            while acknowledged < 400:
                line = await process.stdout.readline()
                assert line, "writer exited early"
                acknowledged = int(line)
    finally:
        process.send_signal(signal.SIGKILL)
        await process.wait()
    store = await open_store(config)
    try:
        got = all_bodies(store, "k")
        assert len(got) >= acknowledged + 1
        assert got == expected(len(got))
        assert put(store, "k").queue_offset == len(got)
    finally:
        await store.stop()


async def test_a_store_keeps_the_commit_log_file_size_it_was_created_with(
        config: StoreConfig, caplog: pytest.LogCaptureFixture) -> None:
    """An upgrade that changed the default (1 GiB -> 32 MiB), or a changed setting, must neither
    refuse the store nor lose it: the files' own size is kept, the setting applies to new stores."""
    store = await open_store(config)
    put_many(store, 300, body_of=lambda i: bytes(300))     # ~100 KB: two 64 KiB files
    await store.stop()
    changed = dataclasses.replace(config, commit_log_segment_bytes=3 * 65536)
    store = await open_store(changed)
    try:
        assert "created with files of 65536 bytes" in caplog.text
        assert store.disk_guard.min_free_bytes == 65536         # the room a new file of the kept size needs
        assert all_bodies(store, "t") == [bytes(300)] * 300
        put_many(store, 300, body_of=lambda i: bytes(300))   # rolls into new files of the kept size
        assert {p.stat().st_size for p in (config.path / "commitlog").iterdir()} == {65536}
        assert store.get_max_offset("t", 0) == 600
    finally:
        await store.stop()
    store = await open_store(config)
    try:
        assert all_bodies(store, "t") == [bytes(300)] * 600
    finally:
        await store.stop()


async def test_commit_log_files_of_different_sizes_are_refused_not_ignored(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 300, body_of=lambda i: bytes(300))
    await store.stop()
    stray = config.path / "commitlog" / f"{4 * 65536:020d}"
    stray.write_bytes(bytes(3 * 65536))
    with pytest.raises(ValueError, match="segment size"):
        await open_store(config)
    stray.unlink()
    store = await open_store(config)                       # nothing was lost
    try:
        assert store.get_max_offset("t", 0) == 300
    finally:
        await store.stop()
