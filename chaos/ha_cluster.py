"""`HACluster`: 1 or 3 controllers and a replica set of two brokers (`broker_id` 0 and 1, one
`broker_name`), each a separate process on loopback with fixed ports (a restarted broker keeps its
address), for the failover tests, the chaos HA cycles and the failover benchmark.

`replica_info()` asks the controllers what they agreed (master, epoch, SyncStateSet);
`send_acked(...)` sends to whichever broker the controllers name master, following a failover."""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from broker.process import BrokerSubprocess
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.codes import RequestCode
from protocol.command import request
from protocol.errors import ConnectionClosed, MQError
from protocol.headers import SendMessageRequestHeader

TOPIC = "ha_chaos"
NAME = "broker-a"


def free_port_pair() -> int:
    """A port p on 127.0.0.1 with p + 1 free too (a broker's HA port, a controller's Raft port),
    drawn below Linux's ephemeral range (32768-60999): a port bind(0) hands out can be taken by an
    outgoing connection's local end before the daemon meant for it binds it, or rebinds it after a
    restart (seen: "address already in use"). Never a port of a pair this process drew lately: pairs
    are often all drawn before any daemon binds its own, and a draw of p + 1 (free until the daemon
    given p binds its HA port there) made two brokers share a port (CI saw it)."""
    for _ in range(1_000):
        port = random.randrange(20_000, 32_000)
        if not {port - 1, port, port + 1} & _DRAWN.keys() and _bindable(port) and _bindable(port + 1):
            _DRAWN[port] = _DRAWN[port + 1] = None
            while len(_DRAWN) > _DRAWN_KEPT:
                del _DRAWN[next(iter(_DRAWN))]
            return port
    raise OSError("no free pair of ports in 20000-32000 on 127.0.0.1")


_DRAWN: dict[int, None] = {}     # ports of the pairs drawn lately, oldest first
_DRAWN_KEPT = 1_024


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    master_id: int
    master_addr: str
    epoch: int
    sync_state_set: tuple[int, ...]


class HACluster:
    """`lease_ms`: the controllers' broker lease (failover takes about this long); `role`:
    SYNC_MASTER or ASYNC_MASTER (the role of whichever broker is master)."""

    def __init__(self, root: Path, *, controllers: int = 1, lease_ms: int = 1_500, role: str = "SYNC_MASTER",
                 heartbeat_ms: int = 200, broker_settings: dict[str, str] | None = None,
                 namesrv: bool = False, metrics: bool = False) -> None:
        """`namesrv`: a name server too, which the brokers register with (`namesrv_addr`);
        `metrics`: each broker serves /metrics on a port of its own (`metrics_ports`)."""
        self.root, self.role = root, role
        self.namesrv = (BrokerSubprocess(None, command=[sys.executable, "-m", "namesrv"], listen_port=free_port_pair())
                        if namesrv else None)
        self.namesrv_addr = f"127.0.0.1:{self.namesrv.listen_port}" if self.namesrv is not None else ""
        ports = [free_port_pair() for _ in range(controllers)]
        peers = ",".join(f"c{i}=127.0.0.1:{port}" for i, port in enumerate(ports)) if controllers > 1 else ""
        python = [sys.executable, "-m", "controller"]
        self.controllers = [BrokerSubprocess(None, command=python, listen_port=port, settings={
            "broker_lease_ms": str(lease_ms), "scan_interval_ms": "100", **({"peers": peers} if peers else {})})
            for port in ports]
        self.controller_addr = ";".join(f"127.0.0.1:{port}" for port in ports)
        common = {"controller_addr": self.controller_addr, "broker_name": NAME,
                  "controller_heartbeat_interval_ms": str(heartbeat_ms), "controller_master_role": role,
                  "ha_heartbeat_interval_ms": "100", "ha_housekeeping_timeout_ms": "3000",
                  "store.sync_flush_timeout_ms": "1000", "store.commit_log_segment_bytes": str(1 << 20),
                  "graceful_shutdown_timeout_ms": "1000", "ha_slave_sync_interval_ms": "100",
                  **({"namesrv_addr": self.namesrv_addr} if self.namesrv_addr else {}), **(broker_settings or {})}
        self.metrics_ports = [free_port_pair() for _ in range(2)] if metrics else [0, 0]
        self.brokers = [
            BrokerSubprocess(root / f"a{broker_id}", listen_port=free_port_pair(),
                             settings={**common, "broker_role": role if broker_id == 0 else "SLAVE",
                                       "broker_id": str(broker_id), "metrics_port": str(self.metrics_ports[broker_id])})
            for broker_id in (0, 1)]
        self._client_remoting = RemotingClient()
        self.api = ClientAPI(self._client_remoting)
        self._remoting = RemotingClient()

    @property
    def _daemons(self) -> list[BrokerSubprocess]:
        return [*self.controllers, *([self.namesrv] if self.namesrv is not None else [])]

    async def start(self) -> None:
        for process in self._daemons:
            await process.start()
        for process in self.brokers:
            await process.start()

    async def stop(self) -> None:
        await self._client_remoting.close()
        await self._remoting.close()
        for process in self.brokers:
            process.signal(signal.SIGCONT)       # a paused broker would ignore SIGTERM
            await process.stop()
        for process in self._daemons:
            await process.stop()

    def address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.brokers[broker_id].listen_port}"

    async def replica_info(self) -> ReplicaInfo | None:
        """What the leader controller says of the replica set (None: no leader answered)."""
        for process in self.controllers:
            if not process.alive():
                continue
            try:
                answer = await self._remoting.invoke(f"127.0.0.1:{process.listen_port}",
                                                     request(RequestCode.CONTROLLER_GET_REPLICA_INFO), 2_000)
            except (MQError, ConnectionClosed, OSError, TimeoutError):
                continue
            info: dict[str, Any] = msgpack.unpackb(answer.body_bytes())
            if not info["is_leader"]:
                continue
            for replicas in info["sets"]:
                if replicas["broker_name"] == NAME and replicas["master_id"] >= 0:
                    return ReplicaInfo(replicas["master_id"], replicas["master_addr"], replicas["epoch"],
                                       tuple(replicas["sync_state_set"]))
        return None

    async def wait_in_sync(self, timeout_s: float = 30.0, *, replicas: int = 2) -> ReplicaInfo:
        """Until a master is named with `replicas` in its SyncStateSet; raises `TimeoutError`."""
        return await self._wait_for(lambda info: len(info.sync_state_set) >= replicas, timeout_s)

    async def wait_out_of_sync(self, timeout_s: float = 30.0) -> ReplicaInfo:
        """Until a master is named alone in its SyncStateSet (the controller has learnt that its
        slave died or was cut off); raises `TimeoutError`. A fault's next cycle waits for this
        before `wait_in_sync`, which would otherwise read the set from before the fault."""
        return await self._wait_for(lambda info: len(info.sync_state_set) < 2, timeout_s)

    async def _wait_for(self, wanted: Callable[[ReplicaInfo], bool], timeout_s: float) -> ReplicaInfo:
        async with asyncio.timeout(timeout_s):
            while True:
                info = await self.replica_info()
                if info is not None and wanted(info):
                    return info
                await asyncio.sleep(0.05)

    async def send_acked(self, key: str, queue_id: int, timeout_s: float = 60.0,
                         properties: dict[str, str] | None = None) -> tuple[str, int]:
        """Send `key` to the current master until one answers SUCCESS; returns (the acknowledged
        body, the master's broker_id). Attempt n's body is `key#n`: an attempt stored but not
        acknowledged may be consumed too, and is not expected (only acknowledged bodies are)."""
        async with asyncio.timeout(timeout_s):
            for attempt in itertools.count():
                info = await self.replica_info()
                if info is not None:
                    body = f"{key}#{attempt}"
                    header = SendMessageRequestHeader(
                        producer_group="pg", topic=TOPIC, queue_id=queue_id, flag=0, born_timestamp=0,
                        properties={"KEYS": key, **(properties or {})})
                    try:
                        await self.api.send_message(info.master_addr, header, body.encode())
                        return body, info.master_id
                    except (MQError, ConnectionClosed, OSError, TimeoutError):
                        pass
                await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()

    def pause(self, broker_id: int, paused: bool) -> None:
        """SIGSTOP / SIGCONT a broker (a master past its lease, then back)."""
        self.brokers[broker_id].signal(signal.SIGSTOP if paused else signal.SIGCONT)

    async def restart(self, broker_id: int) -> None:
        await self.brokers[broker_id].stop()
        await self.brokers[broker_id].start()
