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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from broker.store.commit_log import CommitLog
from broker.store.record import RecordError, decode_stored_fields
from protocol import native
from protocol.message import F_PROPERTIES, F_STORE_TIMESTAMP, F_TOPIC, PROPERTY_KEYS, PROPERTY_UNIQ_KEY

log = logging.getLogger(__name__)


_TIME_BITS = 44                     # epoch ms below 2**44: until the year 2527
_TIME_MASK = (1 << _TIME_BITS) - 1


def index_keys_py(table: dict[str, int | list[int]], prefix: str, properties: list[dict[str, str]],
                  units: list[tuple[int, Any, Any]], start: int, time_bits: int) -> tuple[int, int]:
    """Index a batch's messages from message `start` on, each with the entry
    `commit_log_offset << 44 | time_bits` (`commit_log_offset` being `units[i][0]`) under
    `prefix + key` (`prefix` is "topic#") for each of its keys (`message_keys`): the words of its
    KEYS property, then its UNIQ_KEY; a message with neither is skipped. Stops at the first message
    that is anything else (properties not a dict, KEYS or UNIQ_KEY not a str, a unit not a tuple
    whose item 0 is an int in 0..2**63) and returns (its index, or len(properties) when none is;
    the entries added before it): the caller indexes that one with `KeyIndex.add` and calls again
    after it. The reference of `broker.store._records.index_keys` (C), which does the same."""
    count = min(len(properties), len(units))
    index, added = max(start, 0), 0
    while index < count:
        props, unit = properties[index], units[index]
        if type(props) is not dict or type(unit) is not tuple or not unit or type(unit[0]) is not int:
            break
        words, uniq = props.get(PROPERTY_KEYS), props.get(PROPERTY_UNIQ_KEY)
        if (words is not None and type(words) is not str) or (uniq is not None and type(uniq) is not str):
            break
        if words or uniq:
            if not 0 <= unit[0] < 1 << 63:
                break
            entry = unit[0] << _TIME_BITS | time_bits
            for key in message_keys(words, uniq):
                _add_entry(table, prefix + key, entry)
                added += 1
        index += 1
    return index, added


def message_keys(words: str | None, uniq: str | None) -> list[str]:
    """The keys a message is indexed under: each distinct word of its KEYS (`str.split()`: runs of
    whitespace; in order of first appearance), then its UNIQ_KEY unless empty or one of those words
    (RocketMQ's IndexService indexes each KEYS word and the UNIQ_KEY)."""
    keys = list(dict.fromkeys(words.split())) if words else []
    if uniq and uniq not in keys:
        keys.append(uniq)
    return keys


def _add_entry(table: dict[str, int | list[int]], index_key: str, entry: int) -> None:
    """`entry` under `index_key`: the key's only entry, or one more of its list."""
    found = table.get(index_key)
    if found is None:
        table[index_key] = entry
    elif isinstance(found, list):
        found.append(entry)
    else:
        table[index_key] = [found, entry]


_records = native.load("broker.store._records")
index_keys: Callable[[dict[str, int | list[int]], str, list[dict[str, str]], list[tuple[int, Any, Any]],
                      int, int], tuple[int, int]] = (
    _records.index_keys if _records is not None else index_keys_py)
"""`index_keys_py`, in C when `broker.store._records` was built (no Python per message)."""


class KeyIndex:
    """`topic#key` → the commit-log offsets and store times of the messages indexed under it.

    Built for millions of entries on the send path without feeding the garbage collector: a key is
    one string (`topic#key`, RocketMQ's index key) and an entry one int (commit_log_offset << 44 |
    stored_at_ms), and a key with one message (the usual UNIQ_KEY) maps to that int, not a list.
    Neither strings nor ints are tracked by the collector; the tuples and one-element lists this
    used before were, and the collector's rounds over them cost 1.3 of the 1.8 µs an add took."""

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._table: OrderedDict[str, int | list[int]] = OrderedDict()
        self._entries = 0

    def __len__(self) -> int:
        return self._entries

    def add(self, topic: str, properties: dict[str, str], commit_log_offset: int, stored_at_ms: int) -> None:
        """Index one message by its KEYS words and UNIQ_KEY (`message_keys`; nothing when it has
        neither)."""
        if self._max_entries <= 0:
            return
        entry = commit_log_offset << _TIME_BITS | (stored_at_ms & _TIME_MASK)
        table = self._table
        words = properties.get(PROPERTY_KEYS)
        uniq = properties.get(PROPERTY_UNIQ_KEY)
        if words:
            keys = message_keys(words, uniq)
            for key in keys:
                _add_entry(table, f"{topic}#{key}", entry)
            self._entries += len(keys)
        elif uniq:              # the usual message: a UNIQ_KEY and no KEYS
            _add_entry(table, f"{topic}#{uniq}", entry)
            self._entries += 1
        else:
            return
        self._evict()

    def add_run(self, topic: str, properties: list[dict[str, str]], units: list[tuple[int, Any, Any]],
                stored_at_ms: int) -> None:
        """`add` of a batch's messages (one topic, one store time), in order; `units[i]` is message
        i's (commit_log_offset, ...), as reput hands them off. Indexed by `index_keys` (C when
        built); a message it leaves (unusual types) by `add`."""
        if self._max_entries <= 0:
            return
        table, prefix, time_bits = self._table, f"{topic}#", stored_at_ms & _TIME_MASK
        count, index = len(properties), 0
        while index < count:
            stop, added = index_keys(table, prefix, properties, units, index, time_bits)
            self._entries += added
            if stop < count:
                self.add(topic, properties[stop], units[stop][0], stored_at_ms)
                stop += 1
            index = stop
        self._evict()

    def _evict(self) -> None:
        """Forget the keys indexed longest ago while more than `max_entries` entries are held."""
        table = self._table
        while self._entries > self._max_entries and table:
            _, dropped = table.popitem(last=False)
            self._entries -= len(dropped) if type(dropped) is list else 1

    def query(self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 0) -> list[int]:
        """Commit-log offsets of `topic`'s messages with `key`, newest first, at most `max_num`,
        stored within [begin_ms, end_ms] (end 0: no upper bound)."""
        found = self._table.get(f"{topic}#{key}")
        entries: list[int] = [] if found is None else found if isinstance(found, list) else [found]
        result = []
        for entry in reversed(entries):
            stored_at_ms = entry & _TIME_MASK
            if stored_at_ms >= begin_ms and (end_ms <= 0 or stored_at_ms <= end_ms):
                result.append(entry >> _TIME_BITS)
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
