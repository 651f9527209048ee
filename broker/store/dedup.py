"""`DedupIndex`: the broker's memory of sends it must not store twice (`store.dedup_window_ms`).

A send whose properties carry `DEDUP` (`PROPERTY_DEDUP`, any non-empty value) and a `UNIQ_KEY` is
remembered under (producer group, UNIQ_KEY) for `dedup_window_ms` after it was stored; a later send
with the same pair within the window is not stored again but answered as the first one was (its
msg id, queue id and queue offset), so a producer (or a Spark task) retrying a send whose answer it
lost sees success and the topic holds the message once. RocketMQ has no such index (its
`UNIQ_KEY` only feeds the key index); this is rocketq's, in the spirit of Kafka's idempotent
producer, but keyed by the message id the client already sets.

Persistent by construction: the broker writes the producer group into the stored message (`PGROUP`,
as RocketMQ does for transactional messages), and `rebuild` re-reads the commit log at start, so the
index survives a restart and a kill -9 (only what the commit log kept is remembered). Bounded:
entries older than the window are forgotten as new ones come, and past `max_entries` the oldest go
first. Cost: ~250 bytes of memory per remembered send (a 40-character UNIQ_KEY) (one dict entry: a
`group\\0uniq_key` string and one int packing the `StoredSend`: neither is tracked by the garbage
collector, whose rounds over a million tracked objects cost more than the index itself), two dict
operations per DEDUP send, and at start one scan of the commit log (as the key index's rebuild) when
the window is on. With the window 0 (the default) the property is ignored: nothing is looked up,
remembered or scanned."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

from broker.store.commit_log import CommitLog
from broker.store.record import RecordError, decode_stored_fields
from protocol.message import (
    F_PROPERTIES,
    F_QUEUE_ID,
    F_QUEUE_OFFSET,
    F_STORE_TIMESTAMP,
    PROPERTY_DEDUP,
    PROPERTY_UNIQ_KEY,
)
from protocol.transaction import PROPERTY_PRODUCER_GROUP

log = logging.getLogger(__name__)


_TIME_BITS, _QUEUE_OFFSET_BITS, _QUEUE_ID_BITS, _SIZE_BITS = 44, 64, 32, 32


class StoredSend(NamedTuple):
    """Where a remembered send was stored: its record's commit-log offset (its msg id) and end,
    its queue id and queue offset, and when (epoch ms)."""

    commit_log_offset: int
    end_offset: int
    queue_id: int
    queue_offset: int
    stored_at_ms: int

    def packed(self) -> int:
        """All five in one int (each field within its bits: a size < 2**32, a queue id < 2**32, a
        queue offset < 2**64, a time < 2**44)."""
        value = self.commit_log_offset << _SIZE_BITS | (self.end_offset - self.commit_log_offset)
        value = (value << _QUEUE_ID_BITS | self.queue_id) << _QUEUE_OFFSET_BITS | self.queue_offset
        return value << _TIME_BITS | self.stored_at_ms

    @classmethod
    def unpack(cls, value: int) -> StoredSend:
        stored_at_ms, value = value & ((1 << _TIME_BITS) - 1), value >> _TIME_BITS
        queue_offset, value = value & ((1 << _QUEUE_OFFSET_BITS) - 1), value >> _QUEUE_OFFSET_BITS
        queue_id, value = value & ((1 << _QUEUE_ID_BITS) - 1), value >> _QUEUE_ID_BITS
        size, commit_log_offset = value & ((1 << _SIZE_BITS) - 1), value >> _SIZE_BITS
        return cls(commit_log_offset, commit_log_offset + size, queue_id, queue_offset, stored_at_ms)


_TIME_MASK = (1 << _TIME_BITS) - 1


def dedup_key(properties: dict[str, str]) -> str | None:
    """The UNIQ_KEY of a message that asks for dedup (non-empty `DEDUP` and `UNIQ_KEY`), else None."""
    if not properties.get(PROPERTY_DEDUP):
        return None
    return properties.get(PROPERTY_UNIQ_KEY) or None


class DedupIndex:
    """(producer group, UNIQ_KEY) → `StoredSend`, for `window_ms` after the store time; at most
    `max_entries` (the oldest forgotten first). `window_ms` 0: off (`enabled` False)."""

    def __init__(self, window_ms: int, max_entries: int) -> None:
        self.window_ms, self._max_entries = window_ms, max_entries
        self._table: OrderedDict[str, int] = OrderedDict()    # key → `StoredSend.packed()`

    @property
    def enabled(self) -> bool:
        return self.window_ms > 0 and self._max_entries > 0

    def __len__(self) -> int:
        return len(self._table)

    def find(self, group: str, uniq_key: str, now_ms: int) -> StoredSend | None:
        """The send stored under (group, uniq_key) within the window before `now_ms`, or None."""
        found = self._table.get(f"{group}\0{uniq_key}")
        if found is None or (found & _TIME_MASK) + self.window_ms < now_ms:
            return None
        return StoredSend.unpack(found)

    def find_many(self, group: str, uniq_keys: list[str | None], now_ms: int) -> list[int | None]:
        """`find` of each key (None: not a DEDUP message) in one pass, answers still packed
        (`StoredSend.unpack`): the batch path, without a call or an object per message."""
        get, prefix, oldest_ms = self._table.get, f"{group}\0", now_ms - self.window_ms
        found = [None if key is None else get(prefix + key) for key in uniq_keys]
        if found.count(None) == len(found):         # the usual batch: none stored before
            return found
        return [None if f is None or (f & _TIME_MASK) < oldest_ms else f for f in found]

    def remember_run(self, group: str, uniq_keys: list[str | None], commit_log_offsets: list[int],
                     end_offset: int, queue_id: int, first_queue_offset: int, now_ms: int) -> None:
        """`remember` of the messages of one put (consecutive records and queue offsets; key None:
        not a DEDUP message), in one pass: the same table, in the same order, as `remember` of
        each in turn."""
        if not self.enabled:
            return
        table, prefix = self._table, f"{group}\0"
        ends = [*commit_log_offsets[1:], end_offset]
        low = queue_id << (_QUEUE_OFFSET_BITS + _TIME_BITS) | now_ms     # what every entry of the run shares
        high_shift, queue_offset_shift = _QUEUE_ID_BITS + _QUEUE_OFFSET_BITS + _TIME_BITS, _TIME_BITS
        picked = range(len(uniq_keys)) if None not in uniq_keys else [
            i for i, key in enumerate(uniq_keys) if key is not None]
        keys = [prefix + uniq_keys[i] for i in picked]          # type: ignore[operator]
        values = [(commit_log_offsets[i] << _SIZE_BITS | (ends[i] - commit_log_offsets[i])) << high_shift
                  | (first_queue_offset + i) << queue_offset_shift | low for i in picked]
        before = len(table)
        table.update(zip(keys, values, strict=True))
        if len(table) - before < len(keys):     # a key held before, or twice in the run: last, as `remember`
            for key in keys:
                table.move_to_end(key)
        self._evict(now_ms)

    def _evict(self, now_ms: int) -> None:
        table, oldest_kept_ms = self._table, now_ms - self.window_ms
        while table and (len(table) > self._max_entries
                         or (next(iter(table.values())) & _TIME_MASK) < oldest_kept_ms):
            table.popitem(last=False)

    def remember(self, group: str, uniq_key: str, stored: StoredSend) -> None:
        """Remember a stored send (replacing what the key held: that one was out of the window),
        then forget what fell out of the window or past `max_entries`."""
        if not self.enabled:
            return
        key, table = f"{group}\0{uniq_key}", self._table
        if key in table:
            del table[key]
        table[key] = stored.packed()
        self._evict(stored.stored_at_ms)

    def rebuild(self, commit_log: CommitLog, from_offset: int, to_offset: int) -> int:
        """Remember the DEDUP sends of the commit log's [from_offset, to_offset) (blocking: run
        it in a thread at start); returns how many. Nothing when off."""
        if not self.enabled:
            return 0
        count = 0
        for group, uniq_key, stored in _dedup_records(commit_log, from_offset, to_offset):
            self.remember(group, uniq_key, stored)
            count += 1
        return count


def _dedup_records(commit_log: CommitLog, from_offset: int, to_offset: int) -> Iterator[tuple[str, str, StoredSend]]:
    for commit_log_offset, size, payload in commit_log.records(from_offset, to_offset):
        if b"DEDUP" not in bytes(payload):    # the usual record: not decoded at all
            continue
        try:
            fields = decode_stored_fields(payload)
            properties = fields[F_PROPERTIES]
            uniq_key, group = dedup_key(properties), properties.get(PROPERTY_PRODUCER_GROUP)
            if uniq_key and group:
                yield group, uniq_key, StoredSend(commit_log_offset, commit_log_offset + size, fields[F_QUEUE_ID],
                                                  fields[F_QUEUE_OFFSET], fields[F_STORE_TIMESTAMP])
        except (RecordError, ValueError, TypeError, IndexError, AttributeError) as exc:
            log.debug("dedup index: skipping record at %d: %s", commit_log_offset, exc)
