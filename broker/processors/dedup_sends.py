"""`DedupSends`: what SEND_MESSAGE and SEND_BATCH_MESSAGE do with a `DEDUP` message when the store's
dedup window is on (`broker.store.dedup`): a message already stored under its (producer group,
UNIQ_KEY) within the window is not stored again and is answered with the first one's msg id,
queue id and queue offset (SUCCESS, so a retrying producer sees its send succeed); a new one is
stamped with its producer group (`PGROUP`, for the index's rebuild at start) and remembered once
stored. With the window off, every method returns at its first test."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from broker.store.dedup import DedupIndex, StoredSend, dedup_key
from broker.store.results import PutMessageResult
from protocol.message import PROPERTY_DEDUP, PROPERTY_UNIQ_KEY
from protocol.transaction import PROPERTY_PRODUCER_GROUP

BatchItem = tuple[dict[str, str], int, bytes]      # as `decode_batch` gives them (lists, in fact)


def _keys(properties: Sequence[dict[str, str]]) -> list[str | None]:
    """Each message's UNIQ_KEY when it asks for dedup (`dedup_key`), else None; one comprehension."""
    return [(p.get(PROPERTY_UNIQ_KEY) or None) if p.get(PROPERTY_DEDUP) else None for p in properties]


class DedupSends:
    def __init__(self, index: DedupIndex, clock_ms: Callable[[], int]) -> None:
        self._index, self._clock_ms = index, clock_ms

    def original(self, group: str, properties: dict[str, str]) -> StoredSend | None:
        """The first send of a DEDUP message already stored within the window, else None."""
        if not self._index.enabled:
            return None
        uniq_key = dedup_key(properties)
        return None if uniq_key is None else self._index.find(group, uniq_key, self._clock_ms())

    def stamp(self, group: str, properties: dict[str, str]) -> dict[str, str]:
        """`properties` with `PGROUP` = `group` when the message is a DEDUP one (window on)."""
        if self._index.enabled and dedup_key(properties) is not None:
            return {**properties, PROPERTY_PRODUCER_GROUP: group}
        return properties

    def remember(self, group: str, properties: Sequence[dict[str, str]], result: PutMessageResult,
                 queue_id: int) -> None:
        """Remember the DEDUP messages among those `result` stored (in order, one per property map)."""
        if self._index.enabled:
            self.remember_keys(group, _keys(properties), result, queue_id)

    def remember_keys(self, group: str, keys: list[str | None], result: PutMessageResult, queue_id: int) -> None:
        """`remember` given the stored messages' `dedup_key`s (as `split` gives them)."""
        self._index.remember_run(group, keys, result.commit_log_offsets, result.end_offset, queue_id,
                                 result.queue_offset, self._clock_ms())

    def split(self, group: str, messages: list[BatchItem]
              ) -> tuple[list[BatchItem], list[StoredSend | None] | None, list[str | None] | None]:
        """(the batch's messages to store — DEDUP ones stamped with `PGROUP` —, for each message of
        the batch its first send when it is a duplicate, else None; the `dedup_key`s of the messages
        to store, for `remember`); the second is None when none is a duplicate, the third when
        the window is off."""
        if not self._index.enabled:
            return messages, None, None
        keys = _keys([item[0] for item in messages])
        found = self._index.find_many(group, keys, self._clock_ms())
        for item, key, first in zip(messages, keys, found, strict=True):
            if key is not None and first is None:
                item[0][PROPERTY_PRODUCER_GROUP] = group
        if found.count(None) == len(found):
            return messages, None, keys
        fresh = [item for item, first in zip(messages, found, strict=True) if first is None]
        fresh_keys = [key for key, first in zip(keys, found, strict=True) if first is None]
        return fresh, [None if f is None else StoredSend.unpack(f) for f in found], fresh_keys

    def answer_batch(self, fresh: list[BatchItem], originals: list[StoredSend | None], queue_id: int,
                     store: Callable[[list[BatchItem]], PutMessageResult]) -> tuple[list[int], int, int, int]:
        """A batch holding messages stored before (`originals`, from `split`): `store(fresh)`
        stores the others (when any). Returns the batch's commit-log offsets in order (a
        duplicate's its first send's: the answer's msg ids), the answer's queue id and queue offset
        (the first stored message's, else the first duplicate's) and the end offset to be durable."""
        end_offset = max(o.end_offset for o in originals if o is not None)
        stored: list[int] = []
        queue_offset = -1
        if fresh:
            result = store(fresh)
            stored, end_offset, queue_offset = list(result.commit_log_offsets), result.end_offset, result.queue_offset
        new = iter(stored)
        offsets = [next(new) if o is None else o.commit_log_offset for o in originals]
        if queue_offset < 0:
            first = next(o for o in originals if o is not None)
            queue_id, queue_offset = first.queue_id, first.queue_offset
        return offsets, queue_id, queue_offset, end_offset
