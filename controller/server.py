"""`Controller`: one controller process (RocketMQ `ControllerManager` + `DefaultBrokerHeartbeatManager`).

Brokers send BROKER_HEARTBEAT every `controller_heartbeat_interval_ms` to the leader (a follower
answers CONTROLLER_NOT_LEADER with `leader_addr`); the answer is their replica set as agreed (master,
epoch, SyncStateSet), from which each broker takes its role. A master reports its in-sync replicas
with CONTROLLER_ALTER_SYNC_STATE_SET (CONTROLLER_FENCED_MASTER_EPOCH when it no longer is master at
that epoch). The leader scans every `scan_interval_ms`: a master silent for `broker_lease_ms` is
replaced by the live SyncStateSet member furthest ahead (`state.pick_new_master`) at epoch + 1.
Heartbeat times are the leader's own memory: a new leader gives every broker a fresh lease.

    async with Controller(ControllerConfig(listen_port=0)) as controller: ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from pathlib import Path
from typing import Any

import msgpack

from auth.enforcer import Peer
from auth.requirements import GET, UPDATE, RequirementBuilder, fixed
from auth.server import ServerAuth
from conf.controller import ControllerConfig, parse_peers
from controller import state
from controller.raft import NotLeader, ReplicaSets
from protocol.channel import Channel
from protocol.channel_protocol import ChannelProtocol
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import ConnectionClosed, NoPermission
from protocol.lifecycle import Lifecycle
from protocol.service import PeriodicService

log = logging.getLogger(__name__)
# with authentication on: a broker's reports need Update on Cluster (it signs them with its
# auth.inner_credentials), reading the replica sets Get on Cluster
CONTROLLER_CODE_MAP: dict[int, RequirementBuilder] = {
    RequestCode.BROKER_HEARTBEAT: fixed(("Cluster", "", UPDATE)),
    RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: fixed(("Cluster", "", UPDATE)),
    RequestCode.CONTROLLER_GET_REPLICA_INFO: fixed(("Cluster", "", GET)),
}
MAX_REPLICAS = 10_000          # brokers one controller tracks (a flood of invented names stops here)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _free_port() -> int:
    """A port free on 127.0.0.1 for a lone controller's Raft, which pysyncobj binds later: one below
    the ephemeral range when it can (a port probed free inside that range can meanwhile become an
    outgoing connection's local port, and pysyncobj then retries the bind every second: a test saw
    no leader in 10 s), else any free one."""
    low = 32_768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low > 11_024:
        for _ in range(64):
            port = random.randint(10_000, low - 1)
            with socket.socket() as probe, contextlib.suppress(OSError):
                probe.bind(("127.0.0.1", port))
                return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def raft_address(address: str, offset: int) -> str:
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + offset}"


class Controller(Lifecycle):
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.raft: ReplicaSets | None = None
        self._server: asyncio.Server | None = None
        self._channels: set[Channel] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._heard: dict[tuple[str, int], tuple[int, int]] = {}   # (set, id) -> (last heartbeat ms, max offset)
        self._first_seen: dict[str, int] = {}                       # set -> when a broker of it first reported
        self._was_leader = False
        self._scan = PeriodicService("controller-scan", config.scan_interval_ms, self._scan_masters)
        self._peers_by_raft: dict[str, str] = {}
        config_dir = Path(config.config_dir).expanduser()
        store_file = Path(config.auth.store_file).expanduser() if config.auth.store_file else config_dir / "auth.json"
        self.auth = ServerAuth(config.auth, store_path=store_file, base_dir=config_dir, code_map=CONTROLLER_CODE_MAP,
                               clock_ms=lambda: int(time.time() * 1000), server="controller",
                               listen_host=config.listen_host, protected_mode=False)

    async def start(self) -> None:
        """Listen for brokers, then join the Raft group (raises `OSError` when a port is taken)."""
        config, loop = self.config, asyncio.get_running_loop()
        self.auth.start()
        self._server = await loop.create_server(
            lambda: ChannelProtocol(on_request=self._on_request, on_close=self._channels.discard,
                                    on_connect=self._channels.add, max_frame_bytes=config.max_frame_bytes),
            config.listen_host, config.listen_port, reuse_address=True)
        peers = parse_peers(config.peers)
        me = self.address
        self_id = config.node_id or next((node for node, addr in peers.items()
                                          if int(addr.rpartition(":")[2]) == self.port), "")
        if peers and self_id not in peers:
            raise ValueError(f"this controller ({me}) is not in peers {config.peers!r}; set node_id")
        self._peers_by_raft = {raft_address(addr, config.raft_port_offset): addr for addr in peers.values()}
        others = [raft_address(addr, config.raft_port_offset) for node, addr in peers.items() if node != self_id]
        # alone, Raft talks to nobody: any free port (listen_port + 1 may be another program's)
        own_raft = raft_address(peers[self_id], config.raft_port_offset) if peers else f"127.0.0.1:{_free_port()}"
        self._peers_by_raft.setdefault(own_raft, me)
        data_dir = Path(config.data_dir).expanduser() if config.data_dir else None
        self.raft = await asyncio.to_thread(ReplicaSets, own_raft, others, data_dir)
        await self._scan.start()
        log.info("controller listening on %s (Raft %s; peers %s)", me, own_raft, others or "none")

    async def stop(self) -> None:
        await self._scan.stop()
        if self._server is not None:
            self._server.close()
            for channel in list(self._channels):
                channel.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if self.raft is not None:
            await asyncio.to_thread(self.raft.destroy_synchronous)
            self.raft = None
        self.auth.stop()

    _close = stop

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("controller is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        host = self.config.listen_host if self.config.listen_host not in ("0.0.0.0", "", "::") else "127.0.0.1"
        return f"{host}:{self.port}"

    @property
    def is_leader(self) -> bool:
        return self.raft is not None and self.raft.is_leader

    def leader_address(self) -> str:
        """The leader's broker-facing address ("" unknown)."""
        leader = self.raft.leader if self.raft is not None else None
        return self._peers_by_raft.get(leader, "") if leader else ""

    # -- requests -----------------------------------------------------------------------------------

    def _on_request(self, channel: Channel, request: RemotingCommand) -> None:
        task = asyncio.create_task(self._answer(channel, request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, channel: Channel, request: RemotingCommand) -> None:
        enforcer = self.auth.enforcer
        try:
            if enforcer is not None and enforcer.enabled and request.code in CONTROLLER_CODE_MAP:
                peer = channel.attributes.get("auth_peer")
                if peer is None:
                    peer = channel.attributes["auth_peer"] = Peer(channel.remote_address)
                enforcer.check(request, peer)
            response = await self._handle(request)
        except NoPermission as exc:
            response = request.response(exc.code, remark=exc.remark)
        except NotLeader:
            response = request.response(ResponseCode.CONTROLLER_NOT_LEADER, remark="not the controller leader",
                                        header={"leader_addr": self.leader_address()})
        except (KeyError, TypeError, ValueError) as exc:
            response = request.response(ResponseCode.SYSTEM_ERROR, remark=f"bad request: {exc}")
        if request.is_oneway or channel.closed:
            return
        with contextlib.suppress(ConnectionClosed):
            channel.send(response)

    async def _handle(self, request: RemotingCommand) -> RemotingCommand:
        raft = self.raft
        if raft is None:
            raise NotLeader(None)
        fields = request.fields
        if request.code == RequestCode.CONTROLLER_GET_REPLICA_INFO:
            body = msgpack.packb({"leader": self.leader_address(), "is_leader": raft.is_leader,
                                  "sets": [s.to_fields() for s in raft.all()]}, use_bin_type=True)
            return request.response(body=body)
        if not raft.is_leader:
            raise NotLeader(raft.leader)
        if request.code == RequestCode.BROKER_HEARTBEAT:
            return request.response(header=await self._heartbeat(fields))
        if request.code == RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET:
            name, sync = _text(fields, "broker_name"), fields["sync_state_set"]
            if not isinstance(sync, list) or not all(type(i) is int for i in sync):
                raise TypeError("sync_state_set must be a list of ints")
            result = await raft.apply("alter_sync", name, _int(fields, "master_id"), _int(fields, "epoch"), sync)
            if result is None:
                current = raft.get(name)
                return request.response(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                                        header=current.to_fields() if current else None,
                                        remark="not the master at that epoch")
            return request.response(header=result)
        return request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                remark=f"request code {request.code} is not supported by a controller")

    async def _heartbeat(self, fields: dict[str, Any]) -> dict[str, Any]:
        raft = self.raft
        assert raft is not None
        name, broker_id = _text(fields, "broker_name"), _int(fields, "broker_id")
        addr, ha_addr = _text(fields, "broker_addr"), str(fields.get("ha_addr", ""))
        max_offset = _int(fields, "max_offset")
        now = _now_ms()
        if (name, broker_id) not in self._heard and len(self._heard) >= MAX_REPLICAS:
            raise ValueError(f"this controller already tracks {MAX_REPLICAS} brokers")
        self._heard[(name, broker_id)] = (now, max_offset)
        self._first_seen.setdefault(name, now)
        current = raft.get(name)
        known = current.replicas.get(broker_id) if current else None
        if known is None or known.addr != addr or (ha_addr and known.ha_addr != ha_addr):
            await raft.apply("register", name, broker_id, addr, ha_addr)
            current = raft.get(name)
        if current is None:
            raise NotLeader(raft.leader)
        if current.master_id is None and state.first_master(current, broker_id, bool(fields.get("prefers_master")),
                                                            now - self._first_seen[name], self.config.broker_lease_ms):
            log.info("replica set %s: broker %d is master (epoch %d)", name, broker_id, current.epoch + 1)
            await raft.apply("elect", name, broker_id, current.epoch)
            current = raft.get(name) or current
        return current.to_fields()

    # -- the election scan (leader only) --------------------------------------------------------------

    async def _scan_masters(self) -> None:
        raft = self.raft
        if raft is None or not raft.is_leader:
            self._was_leader = False
            return
        now = _now_ms()
        if not self._was_leader:            # a new leader: every broker gets a fresh lease
            self._was_leader = True
            self._heard = {key: (now, offset) for key, (_, offset) in self._heard.items()}
            for replicas in raft.all():
                for broker_id in replicas.replicas:
                    self._heard.setdefault((replicas.broker_name, broker_id), (now, 0))
            return
        lease = self.config.broker_lease_ms
        for replicas in raft.all():
            if replicas.master_id is None:
                continue
            heard, _ = self._heard.get((replicas.broker_name, replicas.master_id), (0, 0))
            if now - heard < lease:
                continue
            alive = {broker_id: offset for (name, broker_id), (at, offset) in self._heard.items()
                     if name == replicas.broker_name and now - at < lease}
            new_master = state.pick_new_master(replicas, alive)
            if new_master is None:
                continue
            log.warning("replica set %s: master %d silent for %d ms; electing %d (epoch %d)", replicas.broker_name,
                        replicas.master_id, now - heard, new_master, replicas.epoch + 1)
            with contextlib.suppress(NotLeader):
                await raft.apply("elect", replicas.broker_name, new_master, replicas.epoch)


def _text(fields: dict[str, Any], name: str) -> str:
    value = fields[name]
    if type(value) is not str or not value or len(value) > 255:
        raise TypeError(f"{name} must be a non-empty string")
    return value


def _int(fields: dict[str, Any], name: str) -> int:
    value = fields[name]
    if type(value) is not int or not 0 <= value < 1 << 63:
        raise TypeError(f"{name} must be a non-negative int64")
    return value
