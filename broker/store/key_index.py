"""`KeyIndex`: message keys → commit-log offsets, for QUERY_MESSAGE (RocketMQ `IndexService`).

Each message is indexed under `topic#key` for every word of its KEYS property and for its UNIQ_KEY.
Built by reput as it dispatches (the same pass that fills the consume queues) and rebuilt at start
from the commit log (`rebuild`), so it needs no file of its own. Memory is bounded: past
`max_entries` entries the oldest are forgotten first. RocketMQ keeps a hashed index file on disk
(20 M entries per file); the same structure kept as a ring in memory is enough for admin lookups
here, at the cost of the rebuild scan at start."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from broker.store.commit_log import CommitLog
from broker.store.record import RecordError, decode_stored_fields
from protocol import native
from protocol.message import F_PROPERTIES, F_STORE_TIMESTAMP, F_TOPIC, PROPERTY_KEYS, PROPERTY_UNIQ_KEY

log = logging.getLogger(__name__)


_MASK = (1 << 64) - 1
MAX_OFFSET = (1 << 63) - 1
_MIN_MS, _MAX_MS = -(1 << 63), (1 << 63) - 1        # a store time is a signed 64-bit int (C's long long)


def key_hash(prefix: str, key: str) -> int:
    """The 64-bit hash an entry of `prefix + key` is held under: Python's str hash of each (SipHash,
    keyed per process, so a client cannot choose keys that share a bucket), mixed. The same as
    `mix_hash` in broker/store/_records.c."""
    x = ((hash(prefix) & _MASK) * 0x9E3779B97F4A7C15 & _MASK) ^ (hash(key) & _MASK)
    x ^= x >> 29
    x = x * 0xBF58476D1CE4E5B9 & _MASK
    return x ^ (x >> 32)


def _check_ms(stored_ms: int) -> None:
    if not _MIN_MS <= stored_ms <= _MAX_MS:
        raise OverflowError("stored_ms must fit a signed 64-bit int")


class KeyRingPy:
    """The key index's table: at most `capacity` entries (key hash, commit_log_offset, stored_ms);
    past it each new entry forgets the oldest one. The reference of `broker.store._records.KeyRing`
    (C: a fixed ring of 32-byte items linked per hash bucket, RocketMQ's IndexFile kept in memory,
    with no Python object per entry), which answers every call as this does.

    - `add(prefix, key, commit_log_offset, stored_ms)`: one entry; raises `ValueError` for an
      offset outside 0..2**63-1, `OverflowError` for a store time outside a signed 64-bit int (both
      methods), `TypeError` for a non-str prefix or key;
    - `add_run(prefix, properties, units, start, stored_ms) -> (stop, added)`: from message `start`
      on, each message under each of its `message_keys` with commit_log_offset `units[i][0]`. Stops
      at the first message that is anything else (properties not a dict, KEYS or UNIQ_KEY not a
      str, a unit not a tuple whose item 0 is an int, or one outside 0..2**63-1 for a message with a
      key) and returns its index (or len(properties)) and the entries added before it: the caller
      indexes that one itself (`KeyIndex.add`) and calls again after it;
    - `query(prefix, key, max_num, begin_ms=0, end_ms=0)`: the offsets held under the key's hash,
      newest first, at most `max_num`, stored within [begin_ms, end_ms] (end_ms ≤ 0: no upper
      bound). Another key of the same 64-bit hash shares them (2**-64 a pair): the caller checks."""

    def __init__(self, capacity: int) -> None:
        if not 0 <= capacity <= 1 << 36:
            raise ValueError(f"a key ring holds 0 to {1 << 36} entries, not {capacity}")
        self.capacity = capacity
        self._order: deque[int] = deque()                           # each entry's hash, oldest first
        self._by_hash: dict[int, deque[tuple[int, int]]] = {}       # hash -> (offset, stored_ms), oldest first

    def __len__(self) -> int:
        return len(self._order)

    def _insert(self, hashed: int, offset: int, stored_ms: int) -> None:
        if not self.capacity:
            return
        self._order.append(hashed)
        self._by_hash.setdefault(hashed, deque()).append((offset, stored_ms))
        if len(self._order) > self.capacity:
            oldest = self._order.popleft()
            held = self._by_hash[oldest]
            held.popleft()
            if not held:
                del self._by_hash[oldest]

    def add(self, prefix: str, key: str, commit_log_offset: int, stored_ms: int) -> None:
        if not isinstance(prefix, str) or not isinstance(key, str):
            raise TypeError("a key ring's prefix and key are str")
        _check_ms(stored_ms)
        if type(commit_log_offset) is not int or not 0 <= commit_log_offset <= MAX_OFFSET:
            raise ValueError("commit_log_offset must be an int in 0..2**63-1")
        self._insert(key_hash(prefix, key), commit_log_offset, stored_ms)

    def add_run(self, prefix: str, properties: list[dict[str, str]], units: list[tuple[int, Any, Any]],
                start: int, stored_ms: int) -> tuple[int, int]:
        _check_ms(stored_ms)
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
                if not 0 <= unit[0] <= MAX_OFFSET:
                    break
                for key in message_keys(words, uniq):
                    self._insert(key_hash(prefix, key), unit[0], stored_ms)
                    added += 1
            index += 1
        return index, added

    def query(self, prefix: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 0) -> list[int]:
        found: list[int] = []
        if max_num <= 0:
            return found
        for offset, stored_ms in reversed(self._by_hash.get(key_hash(prefix, key), ())):
            if stored_ms >= begin_ms and (end_ms <= 0 or stored_ms <= end_ms):
                found.append(offset)
                if len(found) >= max_num:
                    break
        return found


def message_keys(words: str | None, uniq: str | None) -> list[str]:
    """The keys a message is indexed under: each distinct word of its KEYS (`str.split()`: runs of
    whitespace; in order of first appearance), then its UNIQ_KEY unless empty or one of those words
    (RocketMQ's IndexService indexes each KEYS word and the UNIQ_KEY)."""
    keys = list(dict.fromkeys(words.split())) if words else []
    if uniq and uniq not in keys:
        keys.append(uniq)
    return keys


_records = native.load("broker.store._records")
KeyRing: Callable[[int], KeyRingPy] = _records.KeyRing if _records is not None else KeyRingPy
"""`KeyRingPy`, in C when `broker.store._records` was built (no Python object per entry)."""


class KeyIndex:
    """`topic#key` → the commit-log offsets and store times of the messages indexed under it, at
    most `max_entries` entries (one per key of a message; 0: nothing is indexed), the oldest
    forgotten first.

    Held in a `KeyRing` (C when built): a fixed ring of (key hash, offset, store time), so the send
    path allocates nothing per entry and the memory is bounded by `max_entries` (32 bytes an entry
    and 8 a hash bucket, touched as used). The dict of `topic#key` strings this used before cost
    1 µs an entry on the send path at a million entries (the table's cache misses, the strings made
    and freed, the eviction) and ~150 bytes an entry of memory. An entry is found by its key's hash,
    so `query` answers the offsets of the key (and, at 2**-64 a pair, of another key with the same
    hash: `store_reads.query_by_key` checks the messages it reads)."""

    def __init__(self, max_entries: int) -> None:
        self._ring = KeyRing(max(max_entries, 0))

    def __len__(self) -> int:
        return len(self._ring)

    def add(self, topic: str, properties: dict[str, str], commit_log_offset: int, stored_at_ms: int) -> None:
        """Index one message by its KEYS words and UNIQ_KEY (`message_keys`; nothing when it has
        neither, or when either is not a str or the offset is outside 0..2**63-1)."""
        if not isinstance(properties, dict) or type(commit_log_offset) is not int or type(stored_at_ms) is not int:
            return
        words, uniq = properties.get(PROPERTY_KEYS), properties.get(PROPERTY_UNIQ_KEY)
        if ((words is not None and not isinstance(words, str)) or (uniq is not None and not isinstance(uniq, str))
                or not 0 <= commit_log_offset <= MAX_OFFSET or not _MIN_MS <= stored_at_ms <= _MAX_MS):
            return
        prefix = f"{topic}#"
        if words is None and uniq:          # the usual message: a UNIQ_KEY and no KEYS
            self._ring.add(prefix, uniq, commit_log_offset, stored_at_ms)
            return
        for key in message_keys(words, uniq):
            self._ring.add(prefix, key, commit_log_offset, stored_at_ms)

    def add_run(self, topic: str, properties: list[dict[str, str]], units: list[tuple[int, Any, Any]],
                stored_at_ms: int) -> None:
        """`add` of a batch's messages (one topic, one store time), in order; `units[i]` is message
        i's (commit_log_offset, ...), as reput hands them off. A message `KeyRing.add_run` leaves
        (unusual types) goes through `add`."""
        ring, prefix = self._ring, f"{topic}#"
        count, index = len(properties), 0
        while index < count:
            stop, _ = ring.add_run(prefix, properties, units, index, stored_at_ms)
            if stop < count and stop < len(units):
                unit = units[stop]
                offset = unit[0] if isinstance(unit, tuple | list) and unit else None
                self.add(topic, properties[stop], offset, stored_at_ms)
                stop += 1
            elif stop < count:
                break
            index = stop

    def query(self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 0) -> list[int]:
        """Commit-log offsets of `topic`'s messages with `key`, newest first, at most `max_num`,
        stored within [begin_ms, end_ms] (end 0: no upper bound)."""
        return self._ring.query(f"{topic}#", key, max_num, begin_ms, end_ms)

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
