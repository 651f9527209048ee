"""`ReplicaSets`: the controllers' agreed state (`controller.state`) replicated by pysyncobj's Raft
(leader election, log replication, a journal and snapshots on disk when `data_dir` is given). With
one controller it is a one-node Raft: the node leads at once. pysyncobj ticks in its own thread;
commands are applied there, in log order, on every node; asyncio callers await `apply(...)`, which
returns the command's result once the command is committed. Reads (`get`) see the state applied so
far on this node (complete on the leader for everything it acknowledged)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated  # type: ignore[import-untyped]

from controller import state
from controller.state import ReplicaSet


class NotLeader(Exception):
    """This controller is not the Raft leader (`leader`: the leader's Raft address, or None)."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the controller leader (leader: {leader or 'unknown'})")
        self.leader = leader


class ReplicaSets(SyncObj):  # type: ignore[misc]
    """`self_addr` and `peer_addrs`: Raft "host:port" addresses (the others, not this one)."""

    def __init__(self, self_addr: str, peer_addrs: list[str], data_dir: Path | None = None) -> None:
        self._sets: dict[str, ReplicaSet] = {}      # set before SyncObj.__init__: the replicated state
        options: dict[str, Any] = {"autoTick": True, "dynamicMembershipChange": False,
                                   "connectionRetryTime": 1.0, "raftMinTimeout": 0.4, "raftMaxTimeout": 1.2}
        if data_dir is not None:
            data_dir.mkdir(parents=True, exist_ok=True)
            options.update(fullDumpFile=str(data_dir / "raft.dump"), journalFile=str(data_dir / "raft.journal"))
        self._lock = threading.Lock()
        super().__init__(self_addr, peer_addrs, SyncObjConf(**options))

    # -- replicated commands (run in pysyncobj's thread, on every node, in log order) -------------

    @replicated  # type: ignore[untyped-decorator]
    def _register(self, broker_name: str, broker_id: int, addr: str, ha_addr: str) -> dict[str, Any]:
        with self._lock:
            updated = self._sets[broker_name] = state.register(self._sets.get(broker_name), broker_name,
                                                                 broker_id, addr, ha_addr)
        return updated.to_fields()

    @replicated  # type: ignore[untyped-decorator]
    def _elect(self, broker_name: str, new_master: int, expected_epoch: int) -> dict[str, Any] | None:
        with self._lock:
            current = self._sets.get(broker_name)
            if current is None:
                return None
            updated = self._sets[broker_name] = state.elect(current, new_master, expected_epoch)
        return updated.to_fields()

    @replicated  # type: ignore[untyped-decorator]
    def _alter_sync(self, broker_name: str, master_id: int, epoch: int, sync: list[int]) -> dict[str, Any] | None:
        with self._lock:
            current = self._sets.get(broker_name)
            updated = state.alter_sync(current, master_id, epoch, frozenset(sync)) if current else None
            if updated is None:
                return None
            self._sets[broker_name] = updated
        return updated.to_fields()

    # -- asyncio side -------------------------------------------------------------------------------

    async def apply(self, command: str, *args: Any) -> Any:
        """Replicate `command` (`register`, `elect` or `alter_sync`) and return its result once
        committed; raises `NotLeader` when this node does not lead (or lost the lead meanwhile)."""
        if not self._isLeader():
            raise NotLeader(self.leader)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def done(result: Any, error: int) -> None:
            def settle() -> None:
                if future.done():
                    return
                if error == FAIL_REASON.SUCCESS:
                    future.set_result(result)
                else:
                    future.set_exception(NotLeader(self.leader))
            loop.call_soon_threadsafe(settle)
        getattr(self, f"_{command}")(*args, callback=done)
        return await future

    def get(self, broker_name: str) -> ReplicaSet | None:
        with self._lock:
            return self._sets.get(broker_name)

    def all(self) -> list[ReplicaSet]:
        with self._lock:
            return list(self._sets.values())

    @property
    def is_leader(self) -> bool:
        return bool(self._isLeader())

    @property
    def leader(self) -> str | None:
        node = self._getLeader()
        return None if node is None else str(getattr(node, "address", node))
