"""`ControllerAgent`: a broker's side of controller mode (RocketMQ `ReplicasManager`).

Every `controller_heartbeat_interval_ms` it sends BROKER_HEARTBEAT to the leader controller (any of
`controller_addr`, following CONTROLLER_NOT_LEADER's `leader_addr`) and applies the answer: named
master at a new epoch, it becomes master in process (`Replication.become_master`, the epoch
starting at its log end) and registers with the name servers as broker id 0; another master
named, a master steps down to slave (fenced: its hello carries its epochs, and the new master has
it truncate what the new epoch never had) and a slave follows the named master. As master it
reports its in-sync slaves (CONTROLLER_ALTER_SYNC_STATE_SET) whenever they differ from the
controller's SyncStateSet. A broker never promotes itself: without a controller answer it keeps
its role (a master without slaves in sync refuses SYNC sends: SLAVE_NOT_AVAILABLE)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from broker.ha.wiring import Replication
from broker.store.message_store import MessageStore
from conf.broker import BrokerConfig
from conf.namesrv import parse_namesrv_addr
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import ConnectionClosed, MQError
from protocol.remoting_client import RemotingClient
from protocol.service import Service
from protocol.signing import Credentials

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_MS = 3_000
SLAVE_ROUTE_ID_FOR_ID_0 = 1_000     # a broker configured with broker_id 0, while slave, in the routes


def route_id(config: BrokerConfig, is_master: bool) -> int:
    """The broker id this broker registers with the name servers under: 0 while master (clients
    send to id 0), else its `broker_id` (`SLAVE_ROUTE_ID_FOR_ID_0` for broker_id 0)."""
    if is_master:
        return 0
    return config.broker_id or SLAVE_ROUTE_ID_FOR_ID_0


class ControllerAgent(Service):
    """`on_role(is_master)` after each role change (the broker starts or stops what only a master
    runs, and re-registers). `epoch`, `master_id` and `sync_state_set` as last answered."""

    name = "controller-agent"

    def __init__(self, config: BrokerConfig, replication: Replication, store: MessageStore,
                 address: Callable[[], str], on_role: Callable[[bool], Awaitable[None]], *,
                 credentials: Credentials | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self._config, self._replication, self._store, self._address = config, replication, store, address
        self._on_role = on_role
        self._controllers = parse_namesrv_addr(config.controller_addr)
        self._next = 0
        self._leader: str | None = None
        self._remoting = RemotingClient(credentials=credentials, ssl_context=ssl_context)
        self.epoch = replication.epochs.last_epoch if replication.epochs is not None else 0
        self.master_id = -1
        self.sync_state_set: list[int] = []
        self._pending: dict[int, int] = {}      # slave broker_id -> the log end it must ack to join
        self.answers = 0

    async def run(self) -> None:
        while not self.stopping:
            redirected = False
            try:
                redirected = await self._beat()
            except (MQError, ConnectionClosed, OSError, TimeoutError) as exc:
                log.debug("controller %s: %s", self._leader, exc)
                self._rotate()
            if not redirected and not await self.wait(self._config.controller_heartbeat_interval_ms):
                return

    async def stop(self) -> None:
        await super().stop()
        await self._remoting.close()

    def _rotate(self) -> None:
        self._leader = None
        self._next = (self._next + 1) % len(self._controllers)

    async def _invoke(self, code: int, fields: dict[str, Any]) -> Any:
        address = self._leader or self._controllers[self._next]
        answer = await self._remoting.invoke(address, request(code, fields), REQUEST_TIMEOUT_MS)
        if answer.code == ResponseCode.CONTROLLER_NOT_LEADER:
            leader = answer.fields.get("leader_addr")
            if isinstance(leader, str) and leader and leader != address:
                self._leader = leader
            else:
                self._rotate()
            return None
        self._leader = address
        return answer

    async def _beat(self) -> bool:
        """One heartbeat and what it says; True when redirected (ask the leader at once)."""
        config, replication = self._config, self._replication
        address = self._address()
        answer = await self._invoke(RequestCode.BROKER_HEARTBEAT, {
            "broker_name": config.broker_name, "broker_id": config.broker_id, "broker_addr": address,
            "ha_addr": replication.ha_address(address), "max_offset": self._store.commit_log_max_offset(),
            "epoch": self.epoch, "prefers_master": config.broker_role != "SLAVE"})
        if answer is None:
            return self._leader is not None
        if answer.code != ResponseCode.SUCCESS:
            log.warning("controller %s refused the heartbeat: %s", self._leader, answer.remark)
            return False
        await self._apply(answer.fields)
        return False

    async def _apply(self, fields: dict[str, Any]) -> None:
        master_id, epoch = int(fields.get("master_id", -1)), int(fields.get("epoch", 0))
        self.answers += 1
        self.master_id, self.sync_state_set = master_id, sorted(fields.get("sync_state_set") or [])
        replication, me = self._replication, self._config.broker_id
        if master_id == me:
            if not replication.is_master or epoch > self.epoch:
                log.warning("elected master of %s at epoch %d (commit-log end %d)", self._config.broker_name,
                            epoch, self._store.commit_log_max_offset())
                self.epoch = epoch
                self._pending = {}
                await replication.become_master(epoch)
                if replication.gate is not None:     # the confirmed members' acks, from the first send
                    replication.gate.require(frozenset(set(self.sync_state_set) - {me}))
                await self._on_role(True)
            await self._report_in_sync(epoch)
            return
        if master_id < 0:
            return
        self.epoch = max(self.epoch, epoch)
        if replication.is_master:
            log.warning("broker %d is master of %s at epoch %d: stepping down to slave", master_id,
                        self._config.broker_name, epoch)
            await replication.become_slave(str(fields.get("master_ha_addr", "")) or None)
            await self._on_role(False)
        else:
            replication.follow(str(fields.get("master_ha_addr", "")), str(fields.get("master_addr", "")))

    async def _report_in_sync(self, epoch: int) -> None:
        """Keep the SyncGate and the controller's SyncStateSet in step (RocketMQ's
        `AutoSwitchHAService`): every send needs the confirmed members' acks, and a slave about to
        join's too from the moment it is seen in sync (its mark: the log end then); it is reported
        once it acknowledged its mark (it then has everything ever acknowledged). A member that
        left is dropped from the gate only once the controller confirmed the smaller set, so a
        send is never acknowledged without a replica the controller may still elect."""
        server, gate, me = self._replication.server, self._replication.gate, self._config.broker_id
        if server is None or gate is None:
            return
        confirmed = set(self.sync_state_set) - {me}
        live = server.in_sync_slaves()
        end = self._store.commit_log_max_offset()
        for broker_id in live - confirmed:
            self._pending.setdefault(broker_id, end)
        self._pending = {b: mark for b, mark in self._pending.items() if b in live and b not in confirmed}
        gate.require(frozenset(confirmed | set(self._pending)))
        caught_up = {b for b, mark in self._pending.items() if gate.ack_of(b) >= mark}
        wanted = sorted((confirmed & live) | caught_up | {me})
        if wanted == self.sync_state_set:
            return
        answer = await self._invoke(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
            "broker_name": self._config.broker_name, "master_id": me, "epoch": epoch, "sync_state_set": wanted})
        if answer is not None and answer.code == ResponseCode.SUCCESS:
            self.sync_state_set = sorted(answer.fields.get("sync_state_set") or [])
            gate.require(frozenset(set(self.sync_state_set) - {me}) | frozenset(self._pending))
            log.info("in-sync replicas of %s: %s", self._config.broker_name, self.sync_state_set)
