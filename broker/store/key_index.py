"""`KeyIndex`: message keys → commit-log offsets, for QUERY_MESSAGE (RocketMQ `IndexService`).

Each message is indexed under `topic#key` for every word of its KEYS property and for its UNIQ_KEY.
Built by reput as it dispatches (the same pass that fills the consume queues) and rebuilt at start
from the commit log (`rebuild`), so it needs no file of its own. Memory is bounded: past
`max_entries` offsets the keys indexed longest ago are forgotten first. RocketMQ keeps a hashed
index file on disk (20 M entries per file); an in-memory table is enough for admin lookups here,
at the cost of the rebuild scan at start."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from broker.store.commit_log import CommitLog
from broker.store.record import RecordError, decode_stored_fields
from protocol.message import F_PROPERTIES, F_STORE_TIMESTAMP, F_TOPIC, PROPERTY_KEYS, PROPERTY_UNIQ_KEY

log = logging.getLogger(__name__)


class KeyIndex:
    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._table: OrderedDict[tuple[str, str], list[tuple[int, int]]] = OrderedDict()
        self._entries = 0

    def __len__(self) -> int:
        return self._entries

    def add(self, topic: str, properties: dict[str, str], commit_log_offset: int, stored_at_ms: int) -> None:
        """Index one message by its KEYS words and UNIQ_KEY (nothing when it has neither)."""
        if self._max_entries <= 0:
            return
        entry = (commit_log_offset, stored_at_ms)
        table = self._table
        words = properties.get(PROPERTY_KEYS)
        uniq = properties.get(PROPERTY_UNIQ_KEY)
        if words:
            keys = set(words.split())
            if uniq:
                keys.add(uniq)
            for key in keys:
                table.setdefault((topic, key), []).append(entry)
            self._entries += len(keys)
        elif uniq:              # the usual message: a UNIQ_KEY and no KEYS
            offsets = table.get((topic, uniq))
            if offsets is None:
                table[(topic, uniq)] = [entry]
            else:
                offsets.append(entry)
            self._entries += 1
        else:
            return
        while self._entries > self._max_entries and table:
            _, dropped = table.popitem(last=False)
            self._entries -= len(dropped)

    def query(self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 0) -> list[int]:
        """Commit-log offsets of `topic`'s messages with `key`, newest first, at most `max_num`,
        stored within [begin_ms, end_ms] (end 0: no upper bound)."""
        found = self._table.get((topic, key), [])
        result = []
        for commit_log_offset, stored_at_ms in reversed(found):
            if stored_at_ms >= begin_ms and (end_ms <= 0 or stored_at_ms <= end_ms):
                result.append(commit_log_offset)
                if len(result) >= max_num:
                    break
        return result

    def rebuild(self, records: Iterable[tuple[str, dict[str, str], int, int]]) -> None:
        """Add (topic, properties, commit_log_offset, stored_at_ms) in commit-log order."""
        for topic, properties, commit_log_offset, stored_at_ms in records:
            self.add(topic, properties, commit_log_offset, stored_at_ms)


def indexed_records(commit_log: CommitLog, from_offset: int, to_offset: int
                    ) -> Iterator[tuple[str, dict[str, str], int, int]]:
    """(topic, properties, commit_log_offset, stored_at_ms) of the records in [from, to) for
    `KeyIndex.rebuild` (blocking: run it in a thread at start); undecodable records are skipped."""
    for commit_log_offset, _, payload in commit_log.records(from_offset, to_offset):
        try:
            fields = decode_stored_fields(payload)
            yield fields[F_TOPIC], fields[F_PROPERTIES], commit_log_offset, fields[F_STORE_TIMESTAMP]
        except (RecordError, ValueError, TypeError, IndexError) as exc:
            log.debug("key index: skipping record at %d: %s", commit_log_offset, exc)
