"""SYNC_MASTER + 1 slave as separate processes on loopback: a send is acknowledged only once the
slave has it; a dead slave makes sends answer SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT within the
timeout; a restarted slave catches up and sends succeed again; with the master killed, the slave
serves every acknowledged message; the slave's store checks clean and equals the master's bytes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker.process import BrokerSubprocess
from broker.store.check import check_store
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.errors import FlushSlaveTimeout, MQError, SlaveNotAvailable
from protocol.model import PullStatus
from tests.helpers import free_port, pull_header, send

QUEUES = 2
SYNC_TIMEOUT_MS = 1_000


def slave_process(store: Path, ha_port: int) -> BrokerSubprocess:
    return BrokerSubprocess(store, settings={
        "broker_role": "SLAVE", "broker_id": "1", "ha_master_address": f"127.0.0.1:{ha_port}",
        "ha_heartbeat_interval_ms": "100", "store.commit_log_segment_bytes": "1048576"})


def written_prefix_equal(slave_dir: Path, master_dir: Path) -> int:
    """Compare the slave's commit-log files with the master's up to the slave's last written byte;
    returns how many bytes were compared."""
    compared = 0
    files = sorted((slave_dir / "commitlog").iterdir())
    for index, path in enumerate(files):
        data = path.read_bytes()
        if index == len(files) - 1:
            data = data.rstrip(b"\0")
        assert (master_dir / "commitlog" / path.name).read_bytes()[:len(data)] == data, path.name
        compared += len(data)
    return compared


async def test_sync_master_with_a_slave_across_kills(tmp_path: Path) -> None:
    ha_port = free_port()
    master = BrokerSubprocess(tmp_path / "master", settings={
        "broker_role": "SYNC_MASTER", "ha_listen_port": str(ha_port), "ha_heartbeat_interval_ms": "100",
        "store.sync_flush_timeout_ms": str(SYNC_TIMEOUT_MS), "store.commit_log_segment_bytes": "1048576"})
    slave = slave_process(tmp_path / "slave", ha_port)
    api = ClientAPI(RemotingClient())
    acked: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
    try:
        await master.start()
        await slave.start()

        async def send_until_ok(body: bytes, queue_id: int, deadline_s: float) -> None:
            async with asyncio.timeout(deadline_s):
                while True:
                    try:
                        await send(api, master.address, "ha", body, queue_id=queue_id)
                    except (SlaveNotAvailable, FlushSlaveTimeout):
                        await asyncio.sleep(0.05)
                        continue
                    acked[queue_id].append(body)
                    return

        await send_until_ok(b"first", 0, 10)             # the slave has connected
        sends = [send(api, master.address, "ha", f"a{i}".encode(), queue_id=i % QUEUES) for i in range(200)]
        for i, sent in enumerate(await asyncio.gather(*sends)):
            acked[i % QUEUES].append(f"a{i}".encode())
            assert sent.queue_offset >= 0

        slave.kill()
        await slave.stop()
        began = time.monotonic()
        refused = 0
        for i in range(5):
            try:
                await send(api, master.address, "ha", f"lost{i}".encode(), queue_id=0)
            except (SlaveNotAvailable, FlushSlaveTimeout):
                refused += 1
        assert refused == 5
        assert time.monotonic() - began < 5 * (SYNC_TIMEOUT_MS / 1000 + 1)

        slave = slave_process(tmp_path / "slave", ha_port)
        await slave.start()
        await send_until_ok(b"again", 1, 10)
        for i in range(50):
            await send_until_ok(f"b{i}".encode(), i % QUEUES, 5)

        master.kill()
        await master.stop()
        for queue_id in range(QUEUES):      # every acknowledged message, in its queue's order
            bodies: list[bytes] = []
            async with asyncio.timeout(10):
                while True:
                    result = await api.pull_message(slave.address, pull_header(
                        topic="ha", queue_id=queue_id, queue_offset=len(bodies), max_msg_nums=64), 3_000)
                    if result.status is not PullStatus.FOUND:
                        break
                    bodies += [m.body for m in result.messages]
            # a send answered 11/12 is stored on the master and may be there (once more if resent)
            assert list(dict.fromkeys(b for b in bodies if b in acked[queue_id])) == acked[queue_id]
        assert await slave.stop() == 0
        assert written_prefix_equal(tmp_path / "slave", tmp_path / "master") > 0
        report = check_store(tmp_path / "slave")
        assert report.ok, report
    except MQError as exc:
        raise AssertionError(f"{exc}; master: {master.tail()}; slave: {slave.tail()}") from exc
    finally:
        await api.remoting.close()
        for process in (slave, master):
            process.kill()
            await process.stop()
