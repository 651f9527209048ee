"""`SyncGate`: a SYNC_MASTER's sends wait here for their slaves (RocketMQ's GroupTransferService with
5.x's in-sync replica count, Kafka's `min.insync.replicas`).

Each replication connection reports the commit-log end its slave acknowledged. A slave is in sync
while it is no more than `max_gap_bytes` behind the master's end (RocketMQ `haMaxGapNotInSync`). A
send ending at E is acknowledged once `min_replicas - 1` in-sync slaves (the master is the first
replica) acknowledged E or more: one ack covers every send before it (group commit across senders).
With too few in sync when a send asks, it is answered SLAVE_NOT_AVAILABLE at once; a send not
covered within `timeout_ms` gets FLUSH_SLAVE_TIMEOUT. The message stays stored on the master either
way (as RocketMQ's): only its acknowledgement says it is on enough machines."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from broker.store.flush import Settable
from protocol.errors import FlushSlaveTimeout, SlaveNotAvailable


class SyncGate:
    """`master_end()`: the master's commit-log end (bytes). Acks are per connection id (an int
    the master's server hands each slave connection)."""

    def __init__(self, min_replicas: int, max_gap_bytes: int, timeout_ms: int,
                 master_end: Callable[[], int]) -> None:
        self._needed = min_replicas - 1          # slaves besides the master
        self._max_gap_bytes, self._timeout_ms, self._master_end = max_gap_bytes, timeout_ms, master_end
        self.acks: dict[int, int] = {}           # connection id -> acknowledged commit-log end
        self.slave_ids: dict[int, int] = {}      # connection id -> the slave's broker_id
        # controller mode: the broker ids whose ack every send needs (the SyncStateSet but the
        # master, plus slaves about to join it); None: `min_replicas` of whichever slaves are in sync
        self.required: frozenset[int] | None = None
        # (end_offset, future, value, deadline in loop time), in the order sends asked
        self._waiters: list[tuple[int, Settable[Any], Any, float]] = []
        self._timer: asyncio.TimerHandle | None = None

    # -- what connections report ------------------------------------------------------------------

    def acknowledged(self, connection_id: int, end_offset: int) -> None:
        """A slave acknowledged the commit log up to `end_offset`: resolve what that covers."""
        self.acks[connection_id] = max(end_offset, self.acks.get(connection_id, 0))
        if self._waiters:
            self._resolve(self.acked_offset())

    def disconnected(self, connection_id: int) -> None:
        """A slave's connection closed: it is no longer counted (its waiters run to their timeout)."""
        self.acks.pop(connection_id, None)
        self.slave_ids.pop(connection_id, None)

    # -- what sends ask -----------------------------------------------------------------------------

    def in_sync(self) -> list[int]:
        """Acknowledged ends of the slaves in sync now, highest first."""
        floor = self._master_end() - self._max_gap_bytes
        return sorted((ack for ack in self.acks.values() if ack >= floor), reverse=True)

    def ack_of(self, broker_id: int) -> int:
        """The highest commit-log end `broker_id` acknowledged on a live connection (-1: none)."""
        return max((ack for connection, ack in self.acks.items() if self.slave_ids.get(connection) == broker_id),
                   default=-1)

    def require(self, broker_ids: frozenset[int]) -> None:
        """Controller mode: every send from now on needs an ack from each of `broker_ids`."""
        self.required = broker_ids
        if self._waiters:
            self._resolve(self.acked_offset())

    def in_sync_connections(self) -> list[int]:
        """Connection ids of the slaves in sync now."""
        floor = self._master_end() - self._max_gap_bytes
        return [connection for connection, ack in self.acks.items() if ack >= floor]

    def acked_offset(self) -> int:
        """Every send ending at or before this is on `min_replicas` replicas, or (controller mode)
        on every required replica (-1: none yet)."""
        if self.required is not None:
            return min((self.ack_of(i) for i in self.required), default=self._master_end())
        if self._needed <= 0:
            return self._master_end()
        in_sync = self.in_sync()
        return in_sync[self._needed - 1] if len(in_sync) >= self._needed else -1

    def is_acked(self, end_offset: int) -> bool:
        return end_offset <= self.acked_offset()

    def resolve_when_acked(self, end_offset: int, future: Settable[Any], value: Any) -> None:
        """`future.set_result(value)` once `end_offset` is acknowledged by enough in-sync slaves;
        `SlaveNotAvailable` at once when fewer than that are in sync now, `FlushSlaveTimeout` after
        `timeout_ms`."""
        if future.done():
            return
        if self.is_acked(end_offset):
            future.set_result(value)
            return
        connected = set(self.slave_ids.values())
        if self.required is not None and not self.required <= connected:
            future.set_exception(SlaveNotAvailable(
                f"stored on the master, but in-sync replica(s) {sorted(self.required - connected)} are not connected"))
            return
        if self.required is None and len(self.in_sync()) < self._needed:
            future.set_exception(SlaveNotAvailable(
                f"stored on the master, but only {len(self.in_sync()) + 1} of the {self._needed + 1} replicas "
                f"(in_sync_replicas_min) are in sync"))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_ms / 1000
        self._waiters.append((end_offset, future, value, deadline))
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _resolve(self, acked: int) -> None:
        ready = [w for w in self._waiters if w[0] <= acked]
        if not ready:
            return
        self._waiters = [w for w in self._waiters if w[0] > acked]
        for _, future, value, _ in ready:
            if not future.done():
                future.set_result(value)

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        expired = [w for w in self._waiters if w[3] <= now]
        self._waiters = [w for w in self._waiters if w[3] > now]
        for end_offset, future, _, _ in expired:
            if not future.done():
                future.set_exception(FlushSlaveTimeout(
                    f"stored on the master, but not on {self._needed} in-sync slave(s) within {self._timeout_ms} ms "
                    f"(commit-log end {end_offset}, acknowledged {self.acked_offset()})"))
        if self._waiters:
            self._timer = loop.call_at(min(w[3] for w in self._waiters), self._expire)

    def close(self) -> None:
        """At stop: every waiter is answered FLUSH_SLAVE_TIMEOUT now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiters, self._waiters = self._waiters, []
        for _, future, _, _ in waiters:
            if not future.done():
                future.set_exception(FlushSlaveTimeout("the master is stopping before its slaves had the message"))
