"""What the controllers agree on, per replica set (RocketMQ `ReplicasInfoManager`): the master,
its epoch, the SyncStateSet (replicas holding everything acknowledged) and each broker's addresses.
Pure: every change is a function of the state and a command, applied in the same order on every
controller by `controller.raft`. Liveness (last heartbeats) is not here: it is the leader's own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Replica:
    broker_id: int
    addr: str                 # the broker's "host:port" for clients
    ha_addr: str = ""         # where it listens for slaves while it is master ("" otherwise)


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    """`master_id` None: no master (none elected yet, or none electable). `epoch` grows by one at
    each election; `sync` the in-sync replica ids, the master included."""

    broker_name: str
    master_id: int | None = None
    epoch: int = 0
    sync: frozenset[int] = frozenset()
    replicas: Mapping[int, Replica] = field(default_factory=dict)

    @property
    def master(self) -> Replica | None:
        return self.replicas.get(self.master_id) if self.master_id is not None else None

    def to_fields(self) -> dict[str, Any]:
        """The answer a broker or an admin reads (msgpack-friendly)."""
        master = self.master
        return {"broker_name": self.broker_name, "master_id": -1 if self.master_id is None else self.master_id,
                "master_addr": master.addr if master else "", "master_ha_addr": master.ha_addr if master else "",
                "epoch": self.epoch, "sync_state_set": sorted(self.sync),
                "replicas": {str(r.broker_id): r.addr for r in self.replicas.values()}}


def register(current: ReplicaSet | None, broker_name: str, broker_id: int, addr: str, ha_addr: str) -> ReplicaSet:
    """A broker's addresses, new or changed."""
    base = current or ReplicaSet(broker_name)
    replicas = dict(base.replicas)
    replicas[broker_id] = Replica(broker_id, addr, ha_addr)
    return replace(base, replicas=replicas)


def elect(current: ReplicaSet, new_master: int, expected_epoch: int) -> ReplicaSet:
    """`new_master` becomes master at epoch + 1 with SyncStateSet {new_master} (the others rejoin
    once they caught up with it); unchanged when the epoch moved on meanwhile (another election
    won) or `new_master` is unknown."""
    if current.epoch != expected_epoch or new_master not in current.replicas:
        return current
    return replace(current, master_id=new_master, epoch=current.epoch + 1, sync=frozenset({new_master}))


def alter_sync(current: ReplicaSet, master_id: int, epoch: int, sync: frozenset[int]) -> ReplicaSet | None:
    """The master's new SyncStateSet; None (refused: a fenced master) unless `master_id` is the
    master at `epoch`. The master is always in it; unknown ids are dropped."""
    if current.master_id != master_id or current.epoch != epoch:
        return None
    return replace(current, sync=frozenset(i for i in sync if i in current.replicas) | {master_id})


def pick_new_master(current: ReplicaSet, alive: Mapping[int, int]) -> int | None:
    """RocketMQ `DefaultElectPolicy`: among the SyncStateSet's live replicas other than the master
    (`alive`: broker id -> its last reported commit-log end), the one furthest ahead (ties: the
    lowest id); None when none is alive."""
    candidates = [(-alive[i], i) for i in current.sync if i in alive and i != current.master_id]
    return min(candidates)[1] if candidates else None


def first_master(current: ReplicaSet, broker_id: int, prefers_master: bool, waited_ms: int, lease_ms: int) -> bool:
    """A replica set without a master: may `broker_id` take it? One never elected (epoch 0) takes
    the first broker configured as a master, or any broker once a lease passed without one; later,
    only a member of the SyncStateSet (its log holds everything acknowledged)."""
    if current.epoch == 0:
        return prefers_master or waited_ms >= lease_ms
    return broker_id in current.sync
