"""`rocketq store check`: the offline consistency check of consume queues against the commit log."""

from __future__ import annotations

import os
import time
from pathlib import Path

from click.testing import CliRunner

from broker.cli import main
from broker.store.check import check_store
from broker.store.message_store import MessageStore
from tests.broker.store.conftest import STORE_HOST, put_many, small_config


async def stopped_store(tmp_path: Path, count: int = 250, **overrides: object) -> Path:
    settings: dict[str, object] = {"delete_when": "*", "file_reserved_time_hours": 1, **overrides}
    store = MessageStore(small_config(tmp_path / "store", **settings), store_host=STORE_HOST)
    await store.start()
    put_many(store, count, body_of=lambda i: f"{i:04d}".encode() * 100)
    put_many(store, 30, topic="other", queue_id=2)
    await store.stop()
    return tmp_path / "store"


async def test_a_clean_store_is_consistent(tmp_path: Path) -> None:
    store_dir = await stopped_store(tmp_path)
    report = check_store(store_dir)
    assert (report.ok, report.queues, report.units, report.below_commit_log) == (True, 2, 280, 0)
    result = CliRunner().invoke(main, ["store", "check", "--store-dir", str(store_dir)])
    assert result.exit_code == 0, result.output
    assert "2 consume queues, 280 units checked" in result.output and "consistent" in result.output


async def test_a_damaged_record_and_a_wrong_unit_are_reported(tmp_path: Path) -> None:
    store_dir = await stopped_store(tmp_path)
    segment = sorted((store_dir / "commitlog").iterdir())[0]
    with segment.open("r+b") as file:           # a body byte of the first record: CRC mismatch
        file.seek(60)
        byte = file.read(1)
        file.seek(60)
        file.write(bytes([byte[0] ^ 0xFF]))
    queue_file = sorted((store_dir / "consumequeue" / "other" / "2").iterdir())[0]
    with queue_file.open("r+b") as file:         # unit 5 points at unit 6's record
        file.seek(6 * 20)
        unit6 = file.read(20)
        file.seek(5 * 20)
        file.write(unit6)
    report = check_store(store_dir)
    assert report.problem_count == 2, report.problems
    assert "other:2 queue offset 5" in report.problems[0] and "expected" in report.problems[0]
    assert "t:0 queue offset 0: no intact record" in report.problems[1]
    result = CliRunner().invoke(main, ["store", "check", "--store-dir", str(store_dir)])
    assert result.exit_code == 1 and "INCONSISTENT" in result.output


async def test_units_below_retention_are_counted_not_errors(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = MessageStore(small_config(store_dir, delete_when="*", file_reserved_time_hours=1,
                                      consume_queue_segment_units=1000), store_host=STORE_HOST)
    await store.start()
    put_many(store, 250, body_of=lambda i: f"{i:04d}".encode() * 100)
    await store.flush()
    then = time.time() - 7200
    first = sorted((store_dir / "commitlog").iterdir())[0]
    os.utime(first, (then, then))
    assert (await store.clean_now()).commit_log_files == 1
    await store.stop()
    report = check_store(store_dir)
    assert report.ok and report.below_commit_log > 0 and report.units == 250 - report.below_commit_log
