"""Master/slave replication in one process: real brokers on port 0, real clients over TCP."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from conf.namesrv import NamesrvConfig
from namesrv.namesrv import NameServer
from protocol.errors import FlushSlaveTimeout, ServiceNotAvailable, SlaveNotAvailable
from protocol.model import PullStatus
from tests.conftest import broker_config
from tests.helpers import pull_header, send, wait_until


def commit_log_bytes(broker: Broker, end: int) -> bytes:
    store = broker.store
    assert store is not None
    out = bytearray()
    position = 0
    while position < end:
        chunk = store.replication_chunk(position, 1 << 20)
        assert chunk is not None
        offset, data = chunk
        out += bytes(offset - position) + bytes(data)
        position = offset + len(data)
    return bytes(out[:end])


def slave_config(tmp_path: Path, master: Broker, **overrides: object) -> object:
    assert master.replication is not None
    return broker_config(tmp_path / "slave", broker_role="SLAVE", broker_id=1, ha_slave_sync_interval_ms=50,
                         ha_master_address=f"127.0.0.1:{master.replication.ha_address_port}", **overrides)


async def slave_caught_up(master: Broker, slave: Broker) -> None:
    assert master.store is not None and slave.store is not None
    await wait_until(lambda: slave.store is not None and master.store is not None
                     and slave.store.commit_log_max_offset() == master.store.commit_log_max_offset(),
                     what="slave caught up")


async def test_sync_master_acks_after_the_slave_has_the_message(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path / "master", broker_role="SYNC_MASTER",
                                    ha_slave_sync_interval_ms=50)) as master:
        async with Broker(slave_config(tmp_path, master)) as slave:   # type: ignore[arg-type]
            assert slave.replication is not None and slave.replication.client is not None
            client = slave.replication.client
            await wait_until(lambda: client.connected, what="slave connected")
            for i in range(50):
                await send(client_api, master.address, "ha", f"m{i}".encode(), queue_id=i % 2)
                # acknowledged: the slave has every byte of it already
                assert slave.store is not None and master.store is not None
                assert slave.store.commit_log_max_offset() >= master.store.commit_log_max_offset()
            assert master.store is not None
            end = master.store.commit_log_max_offset()
            assert commit_log_bytes(slave, end) == commit_log_bytes(master, end)
            await wait_until(lambda: slave.store is not None and slave.store.get_max_offset("ha", 0) == 25
                             and slave.topics.get("ha") is not None, what="slave dispatched")
            result = await client_api.pull_message(slave.address, pull_header(topic="ha", queue_id=0), 3_000)
            assert result.status is PullStatus.FOUND
            assert [m.body for m in result.messages] == [f"m{i}".encode() for i in range(0, 50, 2)]
            with pytest.raises(ServiceNotAvailable, match="SLAVE"):
                await send(client_api, slave.address, "ha", b"to the slave")
        # the slave is gone: too few replicas in sync, answered at once
        with pytest.raises((SlaveNotAvailable, FlushSlaveTimeout)):
            await send(client_api, master.address, "ha", b"alone")


async def test_sync_master_without_slave_answers_slave_not_available(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path / "master", broker_role="SYNC_MASTER")) as master:
        with pytest.raises(SlaveNotAvailable):
            await send(client_api, master.address, "ha", b"alone")


async def test_slave_resumes_after_restart(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path / "master")) as master:
        async with Broker(slave_config(tmp_path, master)) as slave:   # type: ignore[arg-type]
            for i in range(20):
                await send(client_api, master.address, "ha", f"a{i}".encode())
            await slave_caught_up(master, slave)
        for i in range(20):
            await send(client_api, master.address, "ha", f"b{i}".encode())
        async with Broker(slave_config(tmp_path, master)) as slave:   # type: ignore[arg-type]
            await slave_caught_up(master, slave)
            assert master.store is not None
            end = master.store.commit_log_max_offset()
            assert commit_log_bytes(slave, end) == commit_log_bytes(master, end)
            await wait_until(lambda: slave.store is not None and slave.store.get_max_offset("ha", 0) == 40,
                             what="slave dispatched")
            assert slave.replication is not None and slave.replication.client is not None
            assert slave.replication.client.sessions == 1


async def test_slave_copies_consumer_offsets(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path / "master", ha_slave_sync_interval_ms=50)) as master:
        await send(client_api, master.address, "ha", b"x")
        await client_api.update_consumer_offset(master.address, "cg", "ha", 0, 1)
        async with Broker(slave_config(tmp_path, master)) as slave:   # type: ignore[arg-type]
            await wait_until(lambda: slave.offsets.query("cg", "ha", 0) == 1, what="offset copied")
            assert slave.topics.get("ha") is not None


async def test_slave_finds_its_master_through_the_name_server(tmp_path: Path, client_api: ClientAPI) -> None:
    async with (NameServer(NamesrvConfig(listen_port=0)) as namesrv,
                Broker(broker_config(tmp_path / "master", namesrv_addr=namesrv.address)) as master):
        await send(client_api, master.address, "ha", b"x")
        async with Broker(broker_config(tmp_path / "slave", broker_role="SLAVE", broker_id=1,
                                        namesrv_addr=namesrv.address)) as slave:
            await slave_caught_up(master, slave)
            assert slave.replication is not None and master.replication is not None
            assert slave.replication.master_address == master.replication.ha_address(master.address)
            await wait_until(lambda: (route := namesrv.routes.topic_route("ha")) is not None
                             and route.broker_datas[0].broker_addrs == {0: master.address, 1: slave.address},
                             what="route lists master and slave")


async def test_a_topic_reaches_the_slave_before_the_messages_stored_in_it(tmp_path: Path,
                                                                          client_api: ClientAPI) -> None:
    """The master sends a changed topic table ahead of the records that follow the change: once a
    SYNC_MASTER acknowledged a send that auto-created its topic, the slave knows the topic (the
    periodic copy, every `ha_slave_sync_interval_ms`, is 10 s away here)."""
    async with Broker(broker_config(tmp_path / "master", broker_role="SYNC_MASTER",
                                    ha_slave_sync_interval_ms=10_000)) as master, \
            Broker(slave_config(tmp_path, master)) as slave:   # type: ignore[arg-type]
        assert slave.replication is not None and slave.replication.client is not None
        client = slave.replication.client
        await wait_until(lambda: client.connected, what="slave connected")
        for i in range(5):
            await send(client_api, master.address, f"new{i}", b"x", properties={"DELAY": "1"})
            assert slave.topics.get(f"new{i}") is not None, f"new{i} unknown to the slave"
