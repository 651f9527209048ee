"""`TransactionTable`: which half messages are still pending, from the half and op records in any
order (RocketMQ `TransactionalMessageServiceImpl#check` rebuilds this per pass from the op queue's
"d" records; we keep it, rebuilt once at start-up from both queues and then kept current). Pure.

A half message is named by its queue offset in RMQ_SYS_TRANS_HALF_TOPIC (RocketMQ's
`tranStateTableOffset`). Half offsets are contiguous from `base`; an op record may come before its
half (a rebuild reads the op queue after the half queue, a property test shuffles both). Memory is
bounded by the pending halves, the gaps among half offsets not yet seen, and ops whose half has not
been seen: resolved halves cost nothing."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class HalfState(enum.Enum):
    PENDING = "pending"
    RESOLVED = "resolved"      # committed, rolled back or dropped
    UNKNOWN = "unknown"        # never stored, or below the half queue's first retained offset


@dataclass(slots=True)
class PendingHalf:
    """`stored_at_ms`: epoch ms the half was stored (0 until known); `checks`: check-backs sent."""

    commit_log_offset: int
    stored_at_ms: int
    checks: int = 0


class TransactionTable:
    def __init__(self, base: int = 0) -> None:
        self.base = base                 # the first half offset that can be known
        self.pending: dict[int, PendingHalf] = {}
        self._next_half = base           # one past the highest half offset seen
        self._gaps: set[int] = set()     # offsets below `_next_half` whose half is not seen yet
        self._early_removed: set[int] = set()       # "d" ops whose half is not seen yet
        self._early_checks: dict[int, int] = {}     # "c" ops whose half is not seen yet

    def _seen(self, half_offset: int) -> bool:
        return self.base <= half_offset < self._next_half and half_offset not in self._gaps

    def add_half(self, half_offset: int, commit_log_offset: int, stored_at_ms: int) -> bool:
        """Record a stored half message; True when it is pending (False: already resolved by an
        op seen earlier, below `base`, or a duplicate)."""
        if half_offset < self.base or self._seen(half_offset):
            return False
        if half_offset >= self._next_half:
            self._gaps.update(range(self._next_half, half_offset))
            self._next_half = half_offset + 1
        else:
            self._gaps.discard(half_offset)
        if half_offset in self._early_removed:
            self._early_removed.discard(half_offset)
            self._early_checks.pop(half_offset, None)
            return False
        self.pending[half_offset] = PendingHalf(commit_log_offset, stored_at_ms,
                                                self._early_checks.pop(half_offset, 0))
        return True

    def remove(self, half_offset: int) -> bool:
        """An op "d" (commit, rollback or drop); True when it resolved a pending half."""
        if self.pending.pop(half_offset, None) is not None:
            return True
        if half_offset >= self.base and not self._seen(half_offset):
            self._early_removed.add(half_offset)
            self._early_checks.pop(half_offset, None)
        return False

    def checked(self, half_offset: int) -> None:
        """An op "c": one more check-back of `half_offset`."""
        half = self.pending.get(half_offset)
        if half is not None:
            half.checks += 1
        elif half_offset >= self.base and not self._seen(half_offset) and half_offset not in self._early_removed:
            self._early_checks[half_offset] = self._early_checks.get(half_offset, 0) + 1

    def state(self, half_offset: int) -> HalfState:
        if half_offset in self.pending:
            return HalfState.PENDING
        if self._seen(half_offset):
            return HalfState.RESOLVED
        return HalfState.UNKNOWN

    def due(self, now_ms: int, timeout_ms: int, limit: int) -> list[int]:
        """Up to `limit` pending half offsets stored at least `timeout_ms` before `now_ms`, oldest
        offset first (RocketMQ's check order: the half queue's)."""
        found = [offset for offset, half in self.pending.items() if now_ms - half.stored_at_ms >= timeout_ms]
        found.sort()
        return found[:limit]

    @property
    def pending_count(self) -> int:
        return len(self.pending)
