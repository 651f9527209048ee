"""A full disk (issue 12) on a real small file system: a tmpfs mounted for the test (needs root;
skipped otherwise). Sends are refused with SERVICE_NOT_AVAILABLE and a remark saying why, nothing
refused is stored, every acknowledged message can still be pulled, and sends resume by themselves
once space is freed; a broker starts on a full disk, and a topic config that cannot be written is
refused. The same with a broker process and another process filling the disk, never a SIGBUS:
tests/chaos/test_disk_fill.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.broker import Broker
from broker.disk import disk_usage
from broker.trace.segments import read_records
from chaos.hostile import small_store_disk
from client.api import ClientAPI
from protocol.errors import ServiceNotAvailable
from protocol.model import PullStatus
from protocol.trace import SENT
from tests.conftest import broker_config
from tests.helpers import pull_header, send, wait_until

KIB = 1024
DISK_BYTES = 4 * 1024 * KIB
SEGMENT_BYTES = 256 * KIB


@contextlib.contextmanager
def small_disk(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` at `path` (chaos's `small_store_disk`); the test skips without root."""
    with small_store_disk(path, size_bytes) as disk:
        if disk is None:
            pytest.skip("mounting a small tmpfs needs root (and tmpfs)")
        yield disk


def fill(path: Path, leave_free_bytes: int) -> Path:
    """A filler file taking all but about `leave_free_bytes` of the file system."""
    filler = path / "filler"
    free = disk_usage(path).free_bytes
    with filler.open("wb") as out:
        out.write(bytes(max(free - leave_free_bytes, 0)))
    return filler


def disk_broker(tmp_path: Path, disk: Path, *, trace: bool = True, **store_settings: object) -> Broker:
    config = broker_config(tmp_path)
    config = dataclasses.replace(config, trace=dataclasses.replace(config.trace, enabled=trace))
    store = dataclasses.replace(config.store, path=disk / "store", commit_log_segment_bytes=SEGMENT_BYTES,
                                consume_queue_segment_units=200,     # a 4000-byte file: no sparse page
                                disk_check_interval_ms=50, **store_settings)   # type: ignore[arg-type]
    return Broker(dataclasses.replace(config, store=store))


async def pull_all(api: ClientAPI, address: str) -> list[bytes]:
    bodies: list[bytes] = []
    queue_offset = 0
    while True:
        result = await api.pull_message(address, pull_header(queue_offset=queue_offset, max_msg_nums=32),
                                        timeout_ms=3_000)
        if result.status is not PullStatus.FOUND:
            return bodies
        bodies += [m.body for m in result.messages]
        queue_offset = result.next_begin_offset


async def test_enospc_refuses_sends_with_the_reason_loses_nothing_and_resumes(tmp_path: Path,
                                                                          client_api: ClientAPI) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        async with disk_broker(tmp_path, disk, disk_space_warning_level_ratio=100) as broker:
            acknowledged: list[bytes] = []
            body = b"x" * (8 * KIB - 200)
            await send(client_api, broker.address, "t", b"first")
            acknowledged.append(b"first")
            filler = fill(disk, leave_free_bytes=SEGMENT_BYTES // 2)   # no room for the next file
            with pytest.raises(ServiceNotAvailable) as refused:
                for index in range(200):
                    payload = b"%04d" % index + body
                    await send(client_api, broker.address, "t", payload)
                    acknowledged.append(payload)
            assert "ENOSPC" in refused.value.remark and "resume" in refused.value.remark
            assert 0 < len(acknowledged) < 200
            # pulls are still served, and every acknowledged message is there
            assert await pull_all(client_api, broker.address) == acknowledged
            with pytest.raises(ServiceNotAvailable):          # still refused: no space yet
                await send(client_api, broker.address, "t", b"refused")
            filler.unlink()
            store = broker.store
            assert store is not None
            await wait_until(lambda: store.disk_guard.refusal is None, timeout_s=5)
            await send(client_api, broker.address, "t", b"after")
            assert await pull_all(client_api, broker.address) == [*acknowledged, b"after"]


async def test_past_the_warning_level_sends_are_refused_and_resume_below_it(tmp_path: Path,
                                                                        client_api: ClientAPI) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        async with disk_broker(tmp_path, disk) as broker:      # disk_space_warning_level_ratio 90
            await send(client_api, broker.address, "t", b"before")
            store = broker.store
            assert store is not None
            filler = fill(disk, leave_free_bytes=DISK_BYTES // 20)       # 95 % used
            await wait_until(lambda: store.disk_guard.refusal is not None, timeout_s=5)
            with pytest.raises(ServiceNotAvailable, match="past disk_space_warning_level_ratio 90%"):
                await send(client_api, broker.address, "t", b"refused")
            writable = 'rocketq_store_writable{cluster="DefaultCluster",node_id="broker-a"}'
            assert f"{writable} 0.0" in (await broker.metrics.render()).decode()
            assert await pull_all(client_api, broker.address) == [b"before"]
            filler.unlink()
            await wait_until(lambda: store.disk_guard.refusal is None, timeout_s=5)
            await send(client_api, broker.address, "t", b"after")
            assert await pull_all(client_api, broker.address) == [b"before", b"after"]
            assert f"{writable} 1.0" in (await broker.metrics.render()).decode()


async def test_past_disk_max_used_space_ratio_the_oldest_files_go_whatever_their_age(
        tmp_path: Path, client_api: ClientAPI) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        async with disk_broker(tmp_path, disk, disk_max_used_space_ratio=40,
                               disk_space_warning_level_ratio=95) as broker:
            store = broker.store
            assert store is not None
            body = b"y" * (8 * KIB - 200)
            while disk_usage(disk).used_ratio < 0.5:                # files of a few seconds' age
                await send(client_api, broker.address, "t", body)
            files_before = sorted((disk / "store" / "commitlog").iterdir())
            result = await store.clean_now()
            assert result.commit_log_files > 0
            assert disk_usage(disk).used_ratio < 0.4                # only as much as needed went
            assert sorted((disk / "store" / "commitlog").iterdir()) == files_before[result.commit_log_files:]
            assert store.get_min_offset("t", 0) > 0


async def test_a_restart_on_a_full_disk_comes_up_read_only_and_rebuilds_once_space_is_freed(
        tmp_path: Path, client_api: ClientAPI) -> None:
    """Recovery must rebuild lost consume queues but the disk has no room for their files: the
    broker starts anyway, refuses sends saying why, and finishes the rebuild by itself once space
    is freed (before: the start failed with ENOSPC, or died of SIGBUS, at every attempt)."""
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        acknowledged = [b"%d" % index for index in range(300)]
        async with disk_broker(tmp_path, disk, disk_space_warning_level_ratio=100) as broker:
            for body in acknowledged:
                await send(client_api, broker.address, "t", body)
        shutil.rmtree(disk / "store" / "consumequeue")          # rebuilt from the commit log at start
        filler = fill(disk, leave_free_bytes=0)
        async with disk_broker(tmp_path, disk, disk_space_warning_level_ratio=100) as broker:
            store = broker.store
            assert store is not None
            with pytest.raises(ServiceNotAvailable, match="rebuilding the consume queues at start failed with ENOSPC"):
                await send(client_api, broker.address, "t", b"refused")
            filler.unlink()
            await wait_until(lambda: store.write_refusal is None, timeout_s=5)
            await send(client_api, broker.address, "t", b"after")
            assert await pull_all(client_api, broker.address) == [*acknowledged, b"after"]


async def test_a_topic_config_the_disk_has_no_room_for_is_refused_and_nothing_is_stored(
        tmp_path: Path, client_api: ClientAPI) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        # no trace: its events would take the last 1,024 bytes, and the disk guard (100 % used)
        # would refuse the sends before the topic config's ENOSPC is reached (CI saw it)
        async with disk_broker(tmp_path, disk, trace=False, disk_space_warning_level_ratio=100) as broker:
            await send(client_api, broker.address, "t", b"first")
            filler = fill(disk, leave_free_bytes=1024)             # less than a page
            with pytest.raises(ServiceNotAvailable, match=r"topics\.json failed with ENOSPC"):
                await client_api.create_topic(broker.address, "made", queue_nums=2)
            with pytest.raises(ServiceNotAvailable, match=r"topics\.json failed with ENOSPC"):
                await send(client_api, broker.address, "auto", b"refused")
            await send(client_api, broker.address, "t", b"second")  # its files have room: still taken
            store = broker.store
            assert store is not None and store.get_max_offset("auto", 0) == 0
            filler.unlink()
            # the guard may have sampled the full disk meanwhile (TSan's CI run did): its next sample clears it
            await wait_until(lambda: store.disk_guard.refusal is None, timeout_s=5)
            await client_api.create_topic(broker.address, "made", queue_nums=2)
            await send(client_api, broker.address, "auto", b"after")
            assert await pull_all(client_api, broker.address) == [b"first", b"second"]
        saved = json.loads((disk / "store" / "config" / "topics.json").read_text())["topic_config_table"]
        assert {"t", "made", "auto"} <= saved.keys()


async def test_a_broker_stops_cleanly_with_its_trace_on_a_full_disk_and_reads_it_after(
        tmp_path: Path, client_api: ClientAPI) -> None:
    """The trace's newest segment is sealed at stop (its summary written): on a full disk that
    fails, the stop goes on (CI saw `OSError: ENOSPC` out of the broker's stop) and the next start
    reads the segment without its summary."""
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        async with disk_broker(tmp_path, disk, disk_space_warning_level_ratio=100) as broker:
            await send(client_api, broker.address, "t", b"traced")
            trace = broker.trace
            assert trace is not None
            await trace.flush()
            filler = fill(disk, leave_free_bytes=0)
        assert not list((disk / "store" / "trace").glob("*.sum"))      # the summary was not written
        filler.unlink()
        async with disk_broker(tmp_path, disk) as broker:
            trace = broker.trace
            assert trace is not None and trace.segments.segment_count >= 1
            records = [r for view in trace.segments.snapshot() for r in read_records(view.path, view.size)]
            assert [r[4] for r in records if r[0] == SENT] == ["t"]
