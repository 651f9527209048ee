"""`DedupIndex`: the broker's memory of sends it must not store twice (`store.dedup_window_ms`).

A send whose properties carry `DEDUP` (`PROPERTY_DEDUP`, any non-empty value) and a `UNIQ_KEY` is
remembered under (producer group, UNIQ_KEY) for `dedup_window_ms` after it was stored; a later send
with the same pair within the window is not stored again but answered as the first one was (its
msg id, queue id and queue offset), so a producer (or a Spark task) retrying a send whose answer it
lost sees success and the topic holds the message once. RocketMQ has no such index (its
`UNIQ_KEY` only feeds the key index); this is rocketq's, in the spirit of Kafka's idempotent
producer, but keyed by the message id the client already sets.

Persistent by construction: the broker writes the producer group into the stored message
(`PGROUP`, as RocketMQ does for transactional messages), and `rebuild` re-reads the commit log at
start, so the index survives a restart and a kill -9 (only what the commit log kept is
remembered). Bounded: entries older than the window are forgotten as new ones come, and past
`max_entries` the oldest go first. Cost: ~200 bytes of memory per remembered send (one dict entry:
a `group\\0uniq_key` string and one int), two dict operations per DEDUP send, and at start one
scan of the commit log (as the key index's rebuild) when the window is on. With the window 0 (the
default) the property is ignored: nothing is looked up, remembered or scanned."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class StoredSend:
    """Where a remembered send was stored: its record's commit-log offset (its msg id) and end,
    its queue id and queue offset, and when (epoch ms)."""

    commit_log_offset: int
    end_offset: int
    queue_id: int
    queue_offset: int
    stored_at_ms: int


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
        self._table: OrderedDict[str, StoredSend] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.window_ms > 0 and self._max_entries > 0

    def __len__(self) -> int:
        return len(self._table)

    def find(self, group: str, uniq_key: str, now_ms: int) -> StoredSend | None:
        """The send stored under (group, uniq_key) within the window before `now_ms`, or None."""
        found = self._table.get(f"{group}\0{uniq_key}")
        if found is None or found.stored_at_ms + self.window_ms < now_ms:
            return None
        return found

    def remember(self, group: str, uniq_key: str, stored: StoredSend) -> None:
        """Remember a stored send (replacing what the key held: that one was out of the window),
        then forget what fell out of the window or past `max_entries`."""
        if not self.enabled:
            return
        key = f"{group}\0{uniq_key}"
        self._table.pop(key, None)
        self._table[key] = stored
        table, oldest_kept_ms = self._table, stored.stored_at_ms - self.window_ms
        while table and (len(table) > self._max_entries
                         or next(iter(table.values())).stored_at_ms < oldest_kept_ms):
            table.popitem(last=False)

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
