"""Retention (issue 12, RocketMQ CleanCommitLogService / CleanConsumeQueueService) with short
settings: which files go, which stay, where min offsets move, and what a consumer behind sees."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from broker.broker import Broker
from broker.store.clean_service import is_time_to_delete
from broker.store.message_store import MessageStore
from broker.store.results import GetMessageStatus
from client.api import ClientAPI
from protocol.model import PullStatus
from tests.broker.store.conftest import STORE_HOST, decoded, put_many, small_config
from tests.conftest import broker_config
from tests.helpers import pull_header, send

HOUR_S = 3600


@pytest.mark.parametrize(("delete_when", "hour", "expected"), [
    ("04", 4, True), ("04", 5, False), ("04;05", 5, True), ("*", 13, True), ("", 4, False),
    ("4", 4, True), ("x;23", 23, True), ("x", 0, False),
])
def test_is_time_to_delete(delete_when: str, hour: int, expected: bool) -> None:
    assert is_time_to_delete(delete_when, hour) is expected


def commit_log_files(store_dir: Path) -> list[str]:
    return sorted(p.name for p in (store_dir / "commitlog").iterdir())


def age(path: Path, hours: float) -> None:
    then = time.time() - hours * HOUR_S
    os.utime(path, (then, then))


async def filled_store(tmp_path: Path, **overrides: object) -> MessageStore:
    """A started store (wall clock) with ~5.5 commit-log files of 64 KiB of queue t:0, 100 units
    per consume-queue file, everything flushed and dispatched."""
    settings: dict[str, object] = {"delete_when": "*", "file_reserved_time_hours": 1,
                                   "disk_max_used_space_ratio": 100, **overrides}
    config = small_config(tmp_path / "store", **settings)
    store = MessageStore(config, store_host=STORE_HOST)
    await store.start()
    put_many(store, 330, body_of=lambda i: f"{i:04d}".encode() * 250)      # ~1 KiB records
    await store.flush()
    return store


async def test_retention_deletes_exactly_the_expired_files_and_moves_min_offsets(tmp_path: Path) -> None:
    store = await filled_store(tmp_path)
    try:
        store_dir = tmp_path / "store"
        files = commit_log_files(store_dir)
        assert len(files) == 6
        for name in files[:2]:
            age(store_dir / "commitlog" / name, 2)          # past file_reserved_time_hours (1)
        age(store_dir / "commitlog" / files[3], 0.5)        # not yet
        cq_dir = store_dir / "consumequeue" / "t" / "0"
        cq_before = sorted(p.name for p in cq_dir.iterdir())

        result = await store.clean_now()

        assert commit_log_files(store_dir) == files[2:]
        assert result.commit_log_files == 2
        new_min = int(files[2])
        assert store.commit_log_min_offset() == new_min
        min_offset = store.get_min_offset("t", 0)
        first = store.get_message("t", 0, min_offset, 1, None)
        assert decoded(first)[0].commit_log_offset >= new_min
        assert store.get_message("t", 0, min_offset - 1, 1, None).status is GetMessageStatus.OFFSET_TOO_SMALL
        # consume-queue files wholly below the new start are gone; the rest stay
        cq_after = sorted(p.name for p in cq_dir.iterdir())
        assert result.consume_queue_files == len(cq_before) - len(cq_after) > 0
        assert int(cq_after[0]) // 20 <= min_offset < int(cq_after[0]) // 20 + 100
        assert (await store.clean_now()).commit_log_files == 0    # nothing else has expired
    finally:
        await store.stop()


async def test_retention_never_deletes_the_last_file_or_one_a_pull_holds(tmp_path: Path) -> None:
    store = await filled_store(tmp_path)
    try:
        store_dir = tmp_path / "store"
        for path in (store_dir / "commitlog").iterdir():
            age(path, 5)
        held = store.get_message("t", 0, 0, 4, None)       # views into the first file, not yet written
        assert (await store.clean_now()).commit_log_files == 0
        assert len(commit_log_files(store_dir)) == 6
        held.messages.clear()
        assert (await store.clean_now()).commit_log_files == 5
        assert len(commit_log_files(store_dir)) == 1            # the one being written stays
    finally:
        await store.stop()


async def test_retention_keeps_files_outside_delete_when(tmp_path: Path) -> None:
    hour = time.localtime().tm_hour
    store = await filled_store(tmp_path, delete_when=f"{(hour + 12) % 24:02d}")
    try:
        for path in (tmp_path / "store" / "commitlog").iterdir():
            age(path, 5)
        assert (await store.clean_now()).commit_log_files == 0
    finally:
        await store.stop()


async def test_retention_survives_a_restart(tmp_path: Path) -> None:
    store = await filled_store(tmp_path)
    for path in sorted((tmp_path / "store" / "commitlog").iterdir())[:3]:
        age(path, 2)
    await store.clean_now()
    min_offset, max_offset = store.get_min_offset("t", 0), store.get_max_offset("t", 0)
    await store.stop()
    store = MessageStore(store._config, store_host=STORE_HOST)
    await store.start()
    try:
        assert (store.get_min_offset("t", 0), store.get_max_offset("t", 0)) == (min_offset, max_offset)
        assert decoded(store.get_message("t", 0, min_offset, 1, None))[0].queue_offset == min_offset
    finally:
        await store.stop()


async def test_a_consumer_behind_retention_is_moved_to_the_new_minimum(tmp_path: Path,
                                                                       client_api: ClientAPI) -> None:
    config = broker_config(tmp_path)
    store_config = dataclasses.replace(config.store, commit_log_segment_bytes=64 * 1024,
                                       consume_queue_segment_units=100, delete_when="*",
                                       file_reserved_time_hours=1)
    async with Broker(dataclasses.replace(config, store=store_config)) as broker:
        for index in range(200):
            await send(client_api, broker.address, "t", f"{index:04d}".encode() * 250)
        store = broker.store
        assert store is not None
        for path in sorted((store_config.path / "commitlog").iterdir())[:2]:
            age(path, 2)
        await store.clean_now()
        new_min = store.get_min_offset("t", 0)
        assert new_min > 0
        moved = await client_api.pull_message(broker.address, pull_header(queue_offset=3), timeout_ms=3_000)
        assert moved.status is PullStatus.OFFSET_ILLEGAL           # PULL_OFFSET_MOVED
        assert moved.next_begin_offset == moved.min_offset == new_min
        resumed = await client_api.pull_message(
            broker.address, pull_header(queue_offset=moved.next_begin_offset), timeout_ms=3_000)
        assert resumed.status is PullStatus.FOUND
        assert resumed.messages[0].queue_offset == new_min
        assert resumed.messages[0].body == f"{new_min:04d}".encode() * 250
