"""`LockManager`: the broker's table of orderly-consumption queue locks (RocketMQ
`RebalanceLockManager`, REFERENCE.md §11).

group → `MessageQueue` → `LockEntry(client_id, last_update_ms)`. A lock belongs to a client id
(not to a connection: a closed connection releases nothing, expiry does), is refreshed by locking
it again, and expires `lock_max_live_ms` (60 s) after its last refresh, measured on the injected
clock's monotonic time. Pure bookkeeping: no I/O, one synchronous call per request, so no lock of
its own is needed on the event loop."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from protocol.clock import Clock
from protocol.model import MessageQueue


@dataclass(slots=True)
class LockEntry:
    client_id: str
    last_update_ms: int     # the clock's monotonic ms at the last grant or refresh


class LockManager:
    def __init__(self, clock: Clock, lock_max_live_ms: int) -> None:
        if lock_max_live_ms <= 0:
            raise ValueError(f"lock_max_live_ms must be > 0, got {lock_max_live_ms}")
        self._clock = clock
        self.lock_max_live_ms = lock_max_live_ms
        self._table: dict[str, dict[MessageQueue, LockEntry]] = {}

    def _expired(self, entry: LockEntry, now_ms: int) -> bool:
        return now_ms - entry.last_update_ms > self.lock_max_live_ms

    def try_lock_batch(self, group: str, queues: Iterable[MessageQueue], client_id: str) -> set[MessageQueue]:
        """Lock each of `queues` for `client_id` where it can: a queue it already holds is refreshed,
        a free or expired one is granted (an expired one taken over), one held by another live
        client is not. Returns the queues `client_id` holds afterwards (RocketMQ `tryLockBatch`)."""
        now_ms = self._clock.monotonic_ms()
        table = self._table.setdefault(group, {})
        granted: set[MessageQueue] = set()
        for mq in queues:
            entry = table.get(mq)
            if entry is None or entry.client_id == client_id or self._expired(entry, now_ms):
                table[mq] = LockEntry(client_id, now_ms)
                granted.add(mq)
        if not table:
            del self._table[group]
        return granted

    def unlock_batch(self, group: str, queues: Iterable[MessageQueue], client_id: str) -> set[MessageQueue]:
        """Release those of `queues` that `client_id` holds (live or expired); a queue held by
        another client is left alone. Returns the queues released (RocketMQ `unlockBatch`)."""
        table = self._table.get(group)
        if table is None:
            return set()
        released: set[MessageQueue] = set()
        for mq in queues:
            entry = table.get(mq)
            if entry is not None and entry.client_id == client_id:
                del table[mq]
                released.add(mq)
        if not table:
            del self._table[group]
        return released

    def is_locked(self, group: str, mq: MessageQueue, client_id: str) -> bool:
        """Whether `client_id` holds a live lock on `mq` (RocketMQ `isLocked`)."""
        entry = self._table.get(group, {}).get(mq)
        return entry is not None and entry.client_id == client_id and \
            not self._expired(entry, self._clock.monotonic_ms())

    def owners(self, group: str) -> dict[MessageQueue, str]:
        """The live locks of `group`: queue → client id (expired entries left out and forgotten)."""
        table = self._table.get(group)
        if table is None:
            return {}
        now_ms = self._clock.monotonic_ms()
        for mq in [mq for mq, entry in table.items() if self._expired(entry, now_ms)]:
            del table[mq]
        return {mq: entry.client_id for mq, entry in table.items()}
