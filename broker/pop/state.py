"""The pure POP state of one (consumer group, topic, queue): which queue offsets are handed out and
not yet acknowledged (in flight, each with its checkpoint id and invisible deadline), which came
back visible (revived), and the pop offset (the next queue offset never handed out). No IO, no
clock: times are passed in (epoch ms).

RocketMQ keeps this as CK (checkpoint) messages with an ack bitmap per popped batch plus a pop
offset per queue, matched by `PopReviveService`; here one entry per offset in flight is the
bitmap (an acked offset is simply no longer there), and the checkpoint id (`ck_id`) of the pop or
change that handed the offset out makes a receipt handle current or stale: an ack or a change whose
handle names another `ck_id` than the entry's is refused (the message was revived or its invisible
time changed since).

Revive: an entry past its deadline goes to `revived` with `reconsume_times + 1`, to be handed out
again before any new offset; past `retry_max_times` it goes to the DLQ instead (`revive_decision`):
a message is delivered at most `retry_max_times + 1` times, as a push consumer's.

Bounds: in flight plus revived stays ≤ `max_in_flight` per queue; past it the pop hands out only
revived offsets (no new ones) until acks or the DLQ make room. FIFO (`fifo=True`): nothing of the
queue is handed out while anything of it is in flight, so the next message of a queue (and hence of
a message group, which the producer hashes to one queue) waits for the previous one's ack or DLQ."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from operator import itemgetter

_FIRST, _SECOND = itemgetter(0), itemgetter(1)


@dataclass(frozen=True, slots=True)
class InFlight:
    """A handed-out offset: the checkpoint that handed it out, its invisible deadline (epoch ms) and
    how many times it was delivered before this delivery (`reconsume_times`; attempt = that + 1).
    Frozen: the offsets of one pop with the same `reconsume_times` share one (a pop of 32 new
    messages makes one, not 32); a change of invisible time replaces its offset's entry."""

    ck_id: int
    deadline_ms: int
    reconsume_times: int


class ReviveDecision(Enum):
    REDELIVER = "redeliver"
    DLQ = "dlq"


def revive_decision(reconsume_times: int, retry_max_times: int) -> ReviveDecision:
    """What becomes of a message whose delivery number `reconsume_times + 1` expired unacknowledged:
    delivered again (with `reconsume_times + 1`) while that stays ≤ `retry_max_times`, else the
    DLQ (`%DLQ%<group>`). With 16: deliveries 1..17, then the DLQ (RocketMQ's push rule)."""
    return ReviveDecision.REDELIVER if reconsume_times + 1 <= retry_max_times else ReviveDecision.DLQ


@dataclass(slots=True)
class QueuePopState:
    """One (group, topic, queue_id). `next_offset`: the pop offset. `in_flight`: queue offset ->
    `InFlight`. `revived`: queue offset -> the `reconsume_times` of its next delivery."""

    next_offset: int
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    revived: dict[int, int] = field(default_factory=dict)
    earliest_ms: int = field(default=0, compare=False)   # ≤ every in-flight deadline: `expired` skips before it

    @property
    def held_count(self) -> int:
        return len(self.in_flight) + len(self.revived)

    def blocked(self, fifo: bool) -> bool:
        """FIFO: the queue hands nothing out while an offset of it is in flight."""
        return fifo and bool(self.in_flight)

    def plan(self, count: int, fifo: bool, max_in_flight: int) -> tuple[list[tuple[int, int]], int]:
        """What a pop of up to `count` may hand out: revived offsets first (lowest first, with their
        reconsume times), and how many new offsets from `next_offset` may follow (0 when FIFO has
        revived ones waiting, or the queue is at `max_in_flight`). Changes nothing."""
        if count <= 0 or self.blocked(fifo):
            return [], 0
        again = [(offset, self.revived[offset]) for offset in sorted(self.revived)[:count]]
        if fifo and self.revived:
            return again, 0
        room = max(0, max_in_flight - self.held_count)
        return again, min(count - len(again), room)

    def hand_out(self, offsets: list[tuple[int, int]], ck_id: int, deadline_ms: int, next_offset: int) -> None:
        """Record a pop: each (offset, reconsume_times) in flight under `ck_id` until `deadline_ms`;
        the pop offset moves up to `next_offset` (never down)."""
        if offsets:
            self.earliest_ms = min(self.earliest_ms, deadline_ms) if self.in_flight else deadline_ms
        revived, in_flight = self.revived, self.in_flight
        times = set(map(_SECOND, offsets))
        if not revived and len(times) == 1:     # (the usual pop: new offsets only) one entry for all, C loops
            in_flight.update(dict.fromkeys(map(_FIRST, offsets), InFlight(ck_id, deadline_ms, times.pop())))
        elif offsets:
            self._hand_out_each(offsets, ck_id, deadline_ms)
        if next_offset > self.next_offset:
            self.next_offset = next_offset

    def _hand_out_each(self, offsets: list[tuple[int, int]], ck_id: int, deadline_ms: int) -> None:
        revived, in_flight = self.revived, self.in_flight
        shared: dict[int, InFlight] = {}        # reconsume_times -> the entry its offsets share
        for offset, reconsume_times in offsets:
            if revived:
                revived.pop(offset, None)
            entry = shared.get(reconsume_times)
            if entry is None:
                entry = shared[reconsume_times] = InFlight(ck_id, deadline_ms, reconsume_times)
            in_flight[offset] = entry

    def current(self, offset: int, ck_id: int) -> InFlight | None:
        """The entry a receipt handle (`ck_id`, `offset`) names, if it is still the current one."""
        entry = self.in_flight.get(offset)
        return entry if entry is not None and entry.ck_id == ck_id else None

    def ack(self, offset: int, ck_id: int) -> bool:
        """Acknowledge; False (nothing changed) for a stale or unknown handle."""
        if self.current(offset, ck_id) is None:
            return False
        del self.in_flight[offset]
        return True

    def change(self, offset: int, ck_id: int, new_ck_id: int, deadline_ms: int) -> bool:
        """Move an in-flight offset to a new checkpoint and deadline (the old handle goes stale);
        False for a stale or unknown handle."""
        entry = self.current(offset, ck_id)
        if entry is None:
            return False
        self.in_flight[offset] = InFlight(new_ck_id, deadline_ms, entry.reconsume_times)
        self.earliest_ms = min(self.earliest_ms, deadline_ms)
        return True

    def expired(self, now_ms: int) -> list[tuple[int, InFlight]]:
        """The in-flight entries whose deadline is ≤ `now_ms`, lowest offset first (nothing scanned
        before the earliest deadline)."""
        if not self.in_flight or now_ms < self.earliest_ms:
            return []
        due = sorted((o, e) for o, e in self.in_flight.items() if e.deadline_ms <= now_ms)
        later = [e.deadline_ms for e in self.in_flight.values() if e.deadline_ms > now_ms]
        self.earliest_ms = min(later) if later else 0
        return due

    def revive(self, offset: int, ck_id: int) -> int | None:
        """Make an expired entry visible again: returns its next `reconsume_times`, or None when the
        entry is no longer the one of `ck_id` (acked or changed meanwhile)."""
        entry = self.current(offset, ck_id)
        if entry is None:
            return None
        del self.in_flight[offset]
        self.revived[offset] = entry.reconsume_times + 1
        return entry.reconsume_times + 1

    def drop(self, offset: int, ck_id: int) -> bool:
        """Forget an expired entry that went to the DLQ (as an ack does)."""
        return self.ack(offset, ck_id)

    # -- snapshot ------------------------------------------------------------------------------

    def to_json(self) -> list[object]:
        return [self.next_offset, [[o, e.ck_id, e.deadline_ms, e.reconsume_times] for o, e in self.in_flight.items()],
                [[o, r] for o, r in self.revived.items()]]

    @classmethod
    def from_json(cls, value: list[list[int]] | list[object]) -> QueuePopState:
        next_offset, in_flight, revived = value
        assert isinstance(next_offset, int) and isinstance(in_flight, list) and isinstance(revived, list)
        state = cls(next_offset, {int(o): InFlight(int(c), int(d), int(r)) for o, c, d, r in in_flight},
                    {int(o): int(r) for o, r in revived})
        state.earliest_ms = min((e.deadline_ms for e in state.in_flight.values()), default=0)
        return state
