"""kill -9 in the middle of concurrent sends loses nothing that was acknowledged."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from broker.broker import Broker
from broker.process import BrokerSubprocess
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.broker import BrokerConfig
from conf.store import StoreConfig
from protocol.errors import MQError
from protocol.model import PullStatus
from tests.helpers import pull_header, send

QUEUES = 4
SENDERS = 8


async def test_kill_9_during_concurrent_sends_loses_no_acknowledged_message(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = BrokerSubprocess(store, settings={"persist_interval_ms": "100",
                                             "store.commit_log_segment_bytes": "1048576"})
    await proc.start()
    address = proc.address
    acked: list[tuple[int, int, bytes]] = []
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    try:
        await send(api, address, "crash", b"first", queue_id=0)
        await api.update_consumer_offset(address, "cg", "crash", 0, 1)
        offsets_file = store / "config" / "consumer_offsets.json"
        async with asyncio.timeout(5):    # committed offsets reach disk within the persist interval
            while not (offsets_file.exists() and "crash@cg" in offsets_file.read_text()):
                await asyncio.sleep(0.01)
        acked.append((0, 0, b"first"))
        enough = asyncio.Event()

        async def sender(n: int) -> None:
            i = 0
            while True:
                body = f"s{n}-{i}".encode()
                queue_id = (n + i) % QUEUES
                try:
                    result = await send(api, address, "crash", body, queue_id=queue_id)
                except MQError:
                    return
                acked.append((queue_id, result.queue_offset, body))
                if len(acked) >= 3_000:
                    enough.set()
                i += 1

        senders = [asyncio.create_task(sender(n)) for n in range(SENDERS)]
        await asyncio.wait_for(enough.wait(), timeout=60)
        proc.kill()                             # sends are still in flight
        await asyncio.wait_for(asyncio.gather(*senders), timeout=10)
    finally:
        proc.kill()
        exit_code = await proc.stop()
        await remoting.close()
    # -SIGKILL, or 255 when the child was reaped before asyncio's watcher saw it (asyncio logs
    # "Unknown child process ... returncode 255"; seen once in ~20 full runs, cause not found). The
    # abort marker is what shows the broker died without a clean stop.
    assert exit_code in (-signal.SIGKILL, 255)
    assert (store / "abort").exists(), "a crash leaves the abort marker"

    config = BrokerConfig(listen_port=0, metrics_port=0, grpc_port=0,
                          store=StoreConfig(path=store, commit_log_segment_bytes=1048576))
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    try:
        async with Broker(config) as broker:
            stored: dict[tuple[int, int], bytes] = {}
            for queue_id in range(QUEUES):
                queue_offset = 0
                while True:
                    result = await api.pull_message(broker.address, pull_header(
                        topic="crash", queue_id=queue_id, queue_offset=queue_offset), 5_000)
                    if result.status is not PullStatus.FOUND:
                        break
                    for m in result.messages:
                        stored[(queue_id, m.queue_offset)] = m.body
                    queue_offset = result.next_begin_offset
            missing = [(q, o, b) for q, o, b in acked if stored.get((q, o)) != b]
            assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
            assert await api.query_consumer_offset(broker.address, "cg", "crash", 0) == 1
            # The store goes on after recovery: new sends get the next queue offsets.
            after = await send(api, broker.address, "crash", b"after", queue_id=1)
            assert after.queue_offset == max(o for q, o in stored if q == 1) + 1
    finally:
        await remoting.close()
    saved = json.loads((store / "config" / "consumer_offsets.json").read_text())
    assert saved["offset_table"]["crash@cg"]["0"] == 1
