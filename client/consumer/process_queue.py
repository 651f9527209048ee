"""The consumer's in-memory cache of pulled messages for one queue (RocketMQ `ProcessQueue`).

REFERENCE.md §12 and §11. Messages are keyed by `queue_offset`. The committed offset of a concurrent
consumer is always the lowest offset still cached (`remove_messages`), which is what makes delivery
at-least-once. Orderly consumers move messages into a consuming map (`take_messages`) and `commit` or
put them back (`make_messages_to_consume_again`).

Pure bookkeeping: no I/O, no locks, no clock. Instants are epoch ms passed in by the caller.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

from protocol.message import PROPERTY_MAX_OFFSET, MessageExt

__all__ = ["PULL_MAX_IDLE_TIME_MS", "REBALANCE_LOCK_INTERVAL_MS", "REBALANCE_LOCK_MAX_LIVE_TIME_MS",
           "ProcessQueue"]

PULL_MAX_IDLE_TIME_MS = 120_000         # a push PQ not pulled for longer is dropped by rebalance
REBALANCE_LOCK_MAX_LIVE_TIME_MS = 30_000  # client-side validity of a broker queue lock
REBALANCE_LOCK_INTERVAL_MS = 20_000     # how often an orderly consumer re-locks its queues


class ProcessQueue:
    """Pulled, not yet consumed messages of one message queue, keyed by `queue_offset`.

    `msg_count` and `msg_size_bytes` (sum of body lengths only, as RocketMQ) count messages cached
    *and* taken for orderly consumption until `commit`. `queue_offset_max` is the highest offset ever
    put (RocketMQ assigns the last new offset; the same for the ascending batches a pull returns).
    `last_pull_at_ms` / `last_consume_at_ms` start at `now_ms`, as RocketMQ stamps them at creation.
    """

    __slots__ = ("_consuming_msgs", "_msgs", "_offsets", "consuming", "dropped", "last_consume_at_ms",
                 "last_lock_at_ms", "last_pull_at_ms", "locked", "msg_acc_cnt", "msg_count",
                 "msg_size_bytes", "queue_offset_max", "try_unlock_times")

    def __init__(self, *, now_ms: int) -> None:
        self._msgs: dict[int, MessageExt] = {}
        self._offsets: list[int] = []            # keys of _msgs, ascending
        self._consuming_msgs: dict[int, MessageExt] = {}
        self.msg_count = 0
        self.msg_size_bytes = 0
        self.queue_offset_max = 0
        self.msg_acc_cnt = 0                     # broker's MAX_OFFSET minus the last offset pulled
        self.dropped = False
        self.last_pull_at_ms = now_ms
        self.last_consume_at_ms = now_ms
        self.locked = False
        self.last_lock_at_ms = 0
        self.consuming = False
        self.try_unlock_times = 0

    def __repr__(self) -> str:
        return (f"ProcessQueue(msg_count={self.msg_count}, msg_size_bytes={self.msg_size_bytes}, "
                f"queue_offset_max={self.queue_offset_max}, dropped={self.dropped}, locked={self.locked})")

    @property
    def max_span(self) -> int:
        """Last cached offset minus the first (0 when empty): the concurrent flow-control span."""
        offsets = self._offsets
        return offsets[-1] - offsets[0] if offsets else 0

    def put_messages(self, msgs: Sequence[MessageExt]) -> bool:
        """Cache `msgs` by `queue_offset`; an offset already cached is skipped (not counted, the cached
        message kept). Returns RocketMQ's `dispatchToConsume`: True when the cache is non-empty and no
        consumption was running, which then sets `consuming` (only orderly consumers use it). Updates
        `msg_acc_cnt` from the MAX_OFFSET property of the last message when positive."""
        table, offsets = self._msgs, self._offsets
        added = size = 0
        offset_max = self.queue_offset_max
        for msg in msgs:
            queue_offset = msg.queue_offset
            if queue_offset in table:
                continue
            table[queue_offset] = msg
            if not offsets or queue_offset > offsets[-1]:
                offsets.append(queue_offset)
            else:
                insort(offsets, queue_offset)
            added += 1
            size += len(msg.body)
            if queue_offset > offset_max:
                offset_max = queue_offset
        self.queue_offset_max = offset_max
        self.msg_count += added
        self.msg_size_bytes += size

        dispatch = False
        if table and not self.consuming:
            dispatch = self.consuming = True
        if msgs:
            last = msgs[-1]
            max_offset = last.properties.get(PROPERTY_MAX_OFFSET)
            if max_offset is not None:
                try:
                    acc_total = int(max_offset) - last.queue_offset
                except ValueError:
                    acc_total = 0
                if acc_total > 0:
                    self.msg_acc_cnt = acc_total
        return dispatch

    def remove_messages(self, msgs: Sequence[MessageExt], *, now_ms: int | None = None) -> int:
        """Drop consumed `msgs` from the cache (offsets not cached are ignored) and return the offset
        to commit: the smallest offset still cached, or `queue_offset_max + 1` if none is; -1 if the
        cache was already empty (commit nothing). Committing the lowest unconsumed offset means a
        restart re-delivers anything not yet consumed: at-least-once, as RocketMQ `removeMessage`.
        `now_ms`, when given, becomes `last_consume_at_ms`."""
        if now_ms is not None:
            self.last_consume_at_ms = now_ms
        table = self._msgs
        if not table:
            return -1
        offsets = self._offsets
        removed = size = 0
        for msg in msgs:
            queue_offset = msg.queue_offset
            cached = table.pop(queue_offset, None)
            if cached is None:
                continue
            if offsets[0] == queue_offset:
                del offsets[0]
            else:
                del offsets[bisect_left(offsets, queue_offset)]
            removed += 1
            size += len(cached.body)
        self.msg_count -= removed
        self.msg_size_bytes -= size
        return offsets[0] if offsets else self.queue_offset_max + 1

    def head_messages(self, n: int) -> list[MessageExt]:
        """The (up to) `n` lowest-offset cached messages, in offset order (nothing is removed)."""
        table = self._msgs
        return [table[queue_offset] for queue_offset in self._offsets[:n]]

    def is_pull_expired(self, now_ms: int, max_idle_ms: int = PULL_MAX_IDLE_TIME_MS) -> bool:
        """True when the last pull is more than `max_idle_ms` before `now_ms` (rebalance then drops and
        recreates a push PQ)."""
        return now_ms - self.last_pull_at_ms > max_idle_ms

    def is_lock_expired(self, now_ms: int, max_live_ms: int = REBALANCE_LOCK_MAX_LIVE_TIME_MS) -> bool:
        """True when the broker lock was last confirmed more than `max_live_ms` before `now_ms`."""
        return now_ms - self.last_lock_at_ms > max_live_ms

    def cached_offset_range(self) -> tuple[int, int] | None:
        """(lowest, highest) cached offset, messages taken for orderly consumption not counted;
        None when nothing is cached (admin running info)."""
        offsets = self._offsets
        return (offsets[0], offsets[-1]) if offsets else None

    def has_temp_message(self) -> bool:
        """Whether any message is cached (taken ones not counted), RocketMQ `hasTempMessage`."""
        return bool(self._msgs)

    # Orderly consumption.

    def take_messages(self, n: int, *, now_ms: int | None = None) -> list[MessageExt]:
        """Move the (up to) `n` lowest-offset cached messages into the consuming map and return them
        in offset order. An empty result clears `consuming`, so the next `put_messages` dispatches.
        They still count in `msg_count`/`msg_size_bytes` until `commit`. RocketMQ `takeMessages`."""
        if now_ms is not None:
            self.last_consume_at_ms = now_ms
        offsets = self._offsets
        taken = offsets[:n] if n > 0 else []
        del offsets[:len(taken)]
        table, consuming = self._msgs, self._consuming_msgs
        result = []
        for queue_offset in taken:
            msg = table.pop(queue_offset)
            consuming[queue_offset] = msg
            result.append(msg)
        if not result:
            self.consuming = False
        return result

    def commit(self, keep: Sequence[MessageExt] = ()) -> int:
        """Forget the taken messages (uncounting them) and return the last taken offset + 1, the offset
        to store; -1 when nothing was taken. RocketMQ `commit`. Taken messages in `keep` stay taken
        (not forgotten, not in the offset): the orderly service's sync listener runs several batches
        per thread hop and commits the ones before a batch that failed; `keep` must then hold
        offsets above every other taken one."""
        consuming = self._consuming_msgs
        kept = [(msg.queue_offset, taken) for msg in keep
                if (taken := consuming.pop(msg.queue_offset, None)) is not None]
        commit_offset = -1
        if consuming:
            self.msg_count -= len(consuming)
            self.msg_size_bytes -= sum(len(msg.body) for msg in consuming.values())
            commit_offset = max(consuming) + 1
            consuming.clear()
        consuming.update(kept)
        return commit_offset

    def make_messages_to_consume_again(self, msgs: Sequence[MessageExt]) -> None:
        """Put taken `msgs` back into the cache to be taken again (counts unchanged). A message that is
        not in the consuming map is ignored (RocketMQ would cache it without counting it); one whose
        offset was cached again meanwhile replaces that copy, counted once."""
        table, offsets, consuming = self._msgs, self._offsets, self._consuming_msgs
        for msg in msgs:
            queue_offset = msg.queue_offset
            taken = consuming.pop(queue_offset, None)
            if taken is None:
                continue
            cached = table.get(queue_offset)
            if cached is None:
                insort(offsets, queue_offset)
            else:
                self.msg_count -= 1
                self.msg_size_bytes -= len(cached.body)
            table[queue_offset] = taken

    def clear(self) -> None:
        """Forget every message and reset counts and `queue_offset_max` (RocketMQ `clear`)."""
        self._msgs.clear()
        self._offsets.clear()
        self._consuming_msgs.clear()
        self.msg_count = 0
        self.msg_size_bytes = 0
        self.queue_offset_max = 0
