"""A slave's acknowledgements under SYNC_FLUSH: written from the fsync's completion, and a disk too
slow for `sync_flush_timeout_ms` cuts the stream (logged), the slave reconnects and, once its disk
keeps up again, acknowledges everything; a SYNC_MASTER's sends meanwhile wait or fail, never
succeed unreplicated. Real brokers on port 0, real clients over TCP."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from conf.broker import BrokerConfig
from protocol.errors import FlushSlaveTimeout, SlaveNotAvailable
from tests.broker.ha.test_replication import slave_caught_up, slave_config
from tests.broker.store.conftest import Disk
from tests.conftest import broker_config
from tests.helpers import send, wait_until


def sync_flush(config: object, timeout_ms: int = 5_000) -> BrokerConfig:
    """`config` with a SYNC_FLUSH store whose fsync waits time out after `timeout_ms` (a master's
    SyncGate waits that long for its slaves too)."""
    assert isinstance(config, BrokerConfig)
    return replace(config, store=replace(config.store, flush_disk_type="SYNC_FLUSH", sync_flush_timeout_ms=timeout_ms))


async def test_a_sync_flush_slave_acknowledges_each_write_once_fsynced(tmp_path: Path, client_api: ClientAPI) -> None:
    """Every SYNC_MASTER send returns with the slave's commit log fsynced past it."""
    async with Broker(sync_flush(broker_config(tmp_path / "master", broker_role="SYNC_MASTER"))) as master, \
            Broker(sync_flush(slave_config(tmp_path, master))) as slave:
        assert slave.store is not None and master.store is not None
        slave_store, master_store = slave.store, master.store
        await wait_until(lambda: slave.replication is not None and slave.replication.client is not None
                         and slave.replication.client.connected, what="slave connected")
        results = await asyncio.gather(*(send(client_api, master.address, "ha", f"m{i}".encode(), queue_id=i % 4)
                                         for i in range(64)))
        assert len(results) == 64
        flushed = slave_store._commit_log_flush.flushed_offset
        assert flushed >= master_store.commit_log_max_offset()


async def test_a_slave_whose_disk_is_too_slow_reconnects_and_catches_up(
        tmp_path: Path, client_api: ClientAPI, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # the master flushes asynchronously: only the slave's disk is slow (without the C fsync thread
    # the slow disk is a patched fsync function, which the master's flushes would call too); its
    # SyncGate still gives a send 300 ms (sync_flush_timeout_ms) for the slave's acknowledgement
    master_config = broker_config(tmp_path / "master", broker_role="SYNC_MASTER")
    master_config = replace(master_config, store=replace(master_config.store, flush_disk_type="ASYNC_FLUSH",
                                                         sync_flush_timeout_ms=300))
    async with Broker(master_config) as master, \
            Broker(sync_flush(slave_config(tmp_path, master), timeout_ms=100)) as slave:
        assert slave.store is not None and slave.replication is not None and slave.replication.client is not None
        client, slave_store = slave.replication.client, slave.store
        await wait_until(lambda: client.connected, what="slave connected")
        await send(client_api, master.address, "ha", b"before")
        disk = Disk(slave_store, monkeypatch)
        sessions = client.sessions
        with caplog.at_level(logging.WARNING, logger="broker.ha.slave"):
            disk.slow(400)                  # past the slave's sync_flush_timeout_ms
            with pytest.raises((FlushSlaveTimeout, SlaveNotAvailable)):
                await send(client_api, master.address, "ha", b"while slow")
            await wait_until(lambda: any("replication from" in r.getMessage() and "stopped" in r.getMessage()
                                         for r in caplog.records), what="the cut logged")
        disk.heal()
        await wait_until(lambda: client.sessions > sessions and client.connected, timeout_s=15,
                         what="slave reconnected")
        await wait_until_sent(client_api, master.address)
        await slave_caught_up(master, slave)
        assert slave_store._commit_log_flush.flushed_offset == slave_store.commit_log_max_offset()


async def wait_until_sent(client_api: ClientAPI, address: str) -> None:
    """A send succeeds (the slave acknowledges again), within 15 s."""
    async with asyncio.timeout(15):
        while True:
            try:
                await send(client_api, address, "ha", b"after")
                return
            except (FlushSlaveTimeout, SlaveNotAvailable):
                await asyncio.sleep(0.05)
