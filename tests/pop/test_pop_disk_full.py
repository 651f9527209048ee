"""POP's revive service on a full disk (a small tmpfs, as tests/broker/test_disk_full.py; needs root,
skipped otherwise): the periodic snapshot of the POP state fails with ENOSPC, is logged and retried
every round instead of ending the service (commit 0208066), so once space returns an unacked message
still comes back, exactly once, and the state written then survives a restart."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
from pathlib import Path

import msgpack
import pytest

from broker.broker import Broker
from client import MessageView, SimpleConsumer
from client.api import ClientAPI
from conf.broker import BrokerConfig
from protocol.errors import ServiceNotAvailable
from tests.broker.test_disk_full import DISK_BYTES, SEGMENT_BYTES, fill, small_disk
from tests.conftest import broker_config
from tests.helpers import send, wait_until

TOPIC = "fullpop"
SNAPSHOT_FAILED = "pop: snapshot not written"


def disk_config(tmp_path: Path, disk: Path) -> BrokerConfig:
    """A broker storing on `disk` that revives every 20 ms and snapshots every 50 ms; sends are
    refused only on a real write failure (no warning ratio)."""
    config = broker_config(tmp_path, pop_revive_interval_ms=20, persist_interval_ms=50)
    store = dataclasses.replace(config.store, path=disk / "store", commit_log_segment_bytes=SEGMENT_BYTES,
                                consume_queue_segment_units=200, disk_check_interval_ms=50,
                                disk_space_warning_level_ratio=100)
    return dataclasses.replace(config, store=store)


def snapshot_is_current(broker: Broker, path: Path) -> bool:
    """The snapshot on disk covers every journal record so far (read as `PopJournal` writes it)."""
    assert broker.pop_service is not None
    try:
        covered = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)[0]
    except FileNotFoundError:
        return False
    return bool(covered == broker.pop_service.snapshot()[0])


def enospc_failures(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.getMessage().startswith(SNAPSHOT_FAILED)
               and f"[Errno {errno.ENOSPC}]" in r.getMessage())


async def test_revive_goes_on_after_snapshots_fail_on_a_full_disk(tmp_path: Path, client_api: ClientAPI,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        config = disk_config(tmp_path, disk)
        snapshot = config.store.path / "config" / "pop_state.msgpack"
        async with Broker(config) as broker:
            await client_api.create_topic(broker.address, TOPIC, 1)
            for body in (b"m0", b"m1"):
                await send(client_api, broker.address, TOPIC, body)
            async with SimpleConsumer("cg", broker.address, subscriptions={TOPIC: "*"},
                                      await_duration_s=0.5) as consumer:
                popped = await consumer.receive(2, invisible_duration_s=2)
                assert [m.body for m in popped] == [b"m0", b"m1"]
                await consumer.ack(popped[0])           # m1 is left to come back after 2 s
                await wait_until(lambda: snapshot_is_current(broker, snapshot), what="a snapshot before the fill")
                with caplog.at_level(logging.WARNING, logger="broker.pop.pop_service"):
                    filler = fill(disk, leave_free_bytes=0)
                    await wait_until(lambda: enospc_failures(caplog) >= 3,
                                     what="the snapshot retried after ENOSPC, round after round")
                filler.unlink()                         # space returns (before m1's invisible time ends)
                back: list[MessageView] = []
                async with asyncio.timeout(10):
                    while not back:
                        back = await consumer.receive(32, invisible_duration_s=30)
                assert [(m.body, m.delivery_attempt) for m in back] == [(b"m1", 2)]
                assert await consumer.receive(32, invisible_duration_s=30) == []     # once, not twice
                await consumer.ack(back[0])
                await wait_until(lambda: snapshot_is_current(broker, snapshot), what="a snapshot once space returned")
            assert not [r for r in caplog.records if "pop-revive failed" in r.getMessage()]

        async with Broker(config) as broker:            # the same store: nothing acked comes back
            await send(client_api, broker.address, TOPIC, b"m2")
            async with SimpleConsumer("cg", broker.address, subscriptions={TOPIC: "*"},
                                      await_duration_s=0.5) as consumer:
                fresh = await consumer.receive(32, invisible_duration_s=1)
                assert [(m.body, m.delivery_attempt) for m in fresh] == [(b"m2", 1)]
                await consumer.ack(fresh[0])
                assert await consumer.receive(32, invisible_duration_s=1) == []


async def test_a_batch_ack_refused_by_a_full_disk_changes_nothing(tmp_path: Path, client_api: ClientAPI) -> None:
    """Past the disk's warning level the journal refuses the batch ack's record: every ack of it
    fails with SERVICE_NOT_AVAILABLE and all stay in flight (the batch is applied only once
    journaled); once space returns the same handles ack."""
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        config = disk_config(tmp_path, disk)
        config = dataclasses.replace(config, store=dataclasses.replace(config.store, disk_space_warning_level_ratio=90))
        async with Broker(config) as broker:
            store, pop = broker.store, broker.pop_service
            assert store is not None and pop is not None
            await client_api.create_topic(broker.address, TOPIC, 1)
            for body in (b"a", b"b", b"c"):
                await send(client_api, broker.address, TOPIC, body)
            async with SimpleConsumer("cg", broker.address, subscriptions={TOPIC: "*"},
                                      await_duration_s=0.5) as consumer:
                popped = await consumer.receive(3, invisible_duration_s=30)
                assert [m.body for m in popped] == [b"a", b"b", b"c"]
                filler = fill(disk, leave_free_bytes=DISK_BYTES // 20)       # 95 % used
                await wait_until(lambda: store.disk_guard.refusal is not None, what="sends refused")
                refused = await asyncio.gather(*(consumer.ack(m) for m in popped), return_exceptions=True)
                assert all(isinstance(error, ServiceNotAvailable) for error in refused), refused
                assert sorted(pop.queues[("cg", TOPIC, 0)].in_flight) == [0, 1, 2]
                filler.unlink()
                await wait_until(lambda: store.disk_guard.refusal is None, what="sends resumed")
                await asyncio.gather(*(consumer.ack(m) for m in popped))
                assert pop.queues[("cg", TOPIC, 0)].in_flight == {}
                assert await consumer.receive(32, invisible_duration_s=30) == []
