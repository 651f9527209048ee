"""`StoreReads`: the read side of `MessageStore` (RocketMQ `DefaultMessageStore#getMessage` and the
offset, time and key queries beside it): pulls by queue offset with the status rules of
REFERENCE.md §2.1, min/max offsets, search by timestamp, key lookups, raw record reads and the
store's read-only counters. A mixin of `MessageStore`, which owns the files it reads (declared
below); reads are synchronous and run within one loop step, like puts, so they never see a torn
record."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

from broker.store.commit_log import CommitLog
from broker.store.consume_queue import BLANK_SIZE, ConsumeQueue, ConsumeQueueTable
from broker.store.flush import CommitLogFlushService
from broker.store.key_index import KeyIndex, message_keys
from broker.store.record import HEADER_BYTES, RecordError, decode_stored_fields, payload_properties
from broker.store.reput import ReputService
from broker.store.results import (
    GetMessageResult,
    GetMessageStatus,
    MatchedOffsets,
    MessageFilter,
)
from conf.store import StoreConfig
from protocol.message import (
    F_COMMIT_LOG_OFFSET,
    F_PROPERTIES,
    F_STORE_TIMESTAMP,
    F_TOPIC,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
)

_CQ_UNITS = struct.Struct(">QIq").iter_unpack
_MIN_UNITS_EXAMINED = 800            # 16000 bytes of consume queue (RocketMQ maxFilterMessageCount)
_TOTAL_RAM_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _has_key(payload: memoryview | bytes, topic: str, key: str) -> bool:
    """Whether the stored message `payload` is of `topic` and has `key` (`message_keys`)."""
    try:
        fields = decode_stored_fields(payload)
    except RecordError:
        return False
    properties = fields[F_PROPERTIES]
    if fields[F_TOPIC] != topic or not isinstance(properties, dict):
        return False
    words, uniq = properties.get(PROPERTY_KEYS), properties.get(PROPERTY_UNIQ_KEY)
    return (isinstance(words, str | None) and isinstance(uniq, str | None)
            and key in message_keys(words, uniq))


class StoreReads:
    """Reads of a `MessageStore`'s commit log, consume queues and key index (see the module doc)."""

    _config: StoreConfig
    _commit_log: CommitLog
    _consume_queues: ConsumeQueueTable
    _reput: ReputService
    _commit_log_flush: CommitLogFlushService
    key_index: KeyIndex

    # get -------------------------------------------------------------------------------------

    def get_message(self, topic: str, queue_id: int, queue_offset: int, max_messages: int,
                    message_filter: MessageFilter | None, matched: MatchedOffsets | None = None) -> GetMessageResult:
        """Up to `max_messages` messages from `queue_offset`, with the status and next_begin_offset
        of REFERENCE.md §2.1 on a master: bounds checks first (NO_MESSAGE_IN_QUEUE when the queue
        does not exist or is empty, OFFSET_TOO_SMALL → min, OFFSET_OVERFLOW_ONE → offset,
        OFFSET_OVERFLOW_BADLY → max, OFFSET_FOUND_NULL → next file's start); then a scan of at most
        max(800, max_messages) units of the one consume-queue file holding `queue_offset`, checking
        "batch full" (max_messages, 32 messages, 256 KiB of records; the first message always fits)
        before filtering; next_begin_offset = queue_offset + units examined. With `matched` covering
        [queue_offset, max) (the filter's known matches), only those messages are read, under the
        same batch limits, and next_begin_offset is the first match not taken, else max."""
        queue = self._consume_queues.get(topic, queue_id)
        if queue is None:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, [], 0, 0, 0, 0, 0)
        min_offset, max_offset = queue.min_offset, queue.max_offset
        if max_offset == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, [], 0, min_offset, max_offset, 0, 0)
        if queue_offset < min_offset:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, [], min_offset, min_offset,
                                    max_offset, 0, 0)
        if queue_offset == max_offset:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, [], queue_offset, min_offset,
                                    max_offset, 0, 0)
        if queue_offset > max_offset:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, [], max_offset, min_offset,
                                    max_offset, 0, 0)
        if matched is not None and matched.covers(queue_offset, max_offset):
            return self._read_matched(queue, matched, queue_offset, min_offset, max_offset, max_messages)
        units = queue.read_units(queue_offset, max(_MIN_UNITS_EXAMINED, max_messages))
        if units is None:
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, [],
                                    queue.next_file_start(queue_offset), min_offset, max_offset, 0, 0)
        return self._scan(units, queue_offset, min_offset, max_offset, max_messages, message_filter)

    def _scan(self, units: memoryview, queue_offset: int, min_offset: int, max_offset: int, max_messages: int,
              message_filter: MessageFilter | None) -> GetMessageResult:
        config = self._config
        max_count = min(max_messages, config.max_transfer_count_on_message_in_memory)
        max_transfer_bytes = config.max_transfer_bytes_on_message_in_memory
        read_payload = self._commit_log.read_payload
        needs_properties = message_filter is not None and message_filter.needs_properties
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        messages: list[memoryview] = []
        transfer_bytes = total_bytes = 0
        next_segment_start = -1
        examined = len(units) // 20
        for index, (commit_log_offset, size, tags_code_) in enumerate(_CQ_UNITS(units)):
            if commit_log_offset < next_segment_start:
                continue
            if messages and (len(messages) >= max_count or transfer_bytes + size > max_transfer_bytes):
                examined = index
                break
            if size == 0 or size == BLANK_SIZE:
                continue
            if message_filter is not None and not message_filter.match_by_consume_queue(tags_code_):
                continue
            payload = read_payload(commit_log_offset, size)
            if payload is None:
                if not messages:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                next_segment_start = self._commit_log.next_segment_start(commit_log_offset)
                continue
            if needs_properties:
                assert message_filter is not None
                if not message_filter.match_by_commit_log(payload_properties(payload)):
                    continue
            messages.append(payload)
            transfer_bytes += size
            total_bytes += size - HEADER_BYTES
            status = GetMessageStatus.FOUND
        return GetMessageResult(status, messages, queue_offset + examined, min_offset, max_offset,
                                len(messages), total_bytes)

    def _read_matched(self, queue: ConsumeQueue, matched: MatchedOffsets, queue_offset: int, min_offset: int,
                      max_offset: int, max_messages: int) -> GetMessageResult:
        config = self._config
        max_count = min(max_messages, config.max_transfer_count_on_message_in_memory)
        max_transfer_bytes = config.max_transfer_bytes_on_message_in_memory
        limit = max_count + 1
        offsets = matched.matches_from(queue_offset, limit)
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        messages: list[memoryview] = []
        transfer_bytes = total_bytes = 0
        next_begin_offset = max_offset if len(offsets) < limit else offsets[-1] + 1
        for match_offset in offsets:
            unit = queue.unit_at(match_offset)
            if unit is None or unit[1] == 0 or unit[1] == BLANK_SIZE:
                continue
            commit_log_offset, size, _ = unit
            if messages and (len(messages) >= max_count or transfer_bytes + size > max_transfer_bytes):
                next_begin_offset = match_offset
                break
            payload = self._commit_log.read_payload(commit_log_offset, size)
            if payload is None:
                if not messages:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            messages.append(payload)
            transfer_bytes += size
            total_bytes += size - HEADER_BYTES
            status = GetMessageStatus.FOUND
        return GetMessageResult(status, messages, next_begin_offset, min_offset, max_offset, len(messages),
                                total_bytes)

    # queue queries ---------------------------------------------------------------------------

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's next queue offset to be written; 0 when the queue does not exist."""
        queue = self._consume_queues.get(topic, queue_id)
        return queue.max_offset if queue is not None else 0

    def check_in_disk_by_consume_offset(self, topic: str, queue_id: int, queue_offset: int) -> bool:
        """True when the message at `queue_offset` lies more than `access_message_in_memory_max_ratio`
        % of physical RAM behind the commit log's end (RocketMQ `checkInDiskByConsumeOffset`); False
        when there is no such message."""
        queue = self._consume_queues.get(topic, queue_id)
        unit = queue.unit_at(queue_offset) if queue is not None else None
        if unit is None:
            return False
        lag_bytes = self.commit_log_max_offset() - unit[0]
        return lag_bytes > _TOTAL_RAM_BYTES * self._config.access_message_in_memory_max_ratio // 100

    def get_min_offset(self, topic: str, queue_id: int) -> int:
        """The queue's first readable queue offset; 0 when the queue does not exist."""
        queue = self._consume_queues.get(topic, queue_id)
        return queue.min_offset if queue is not None else 0

    def get_earliest_msg_store_time(self, topic: str, queue_id: int) -> int:
        """store_timestamp (epoch ms) of the message at the queue's min offset; -1 if none."""
        queue = self._consume_queues.get(topic, queue_id)
        if queue is None or queue.min_offset >= queue.max_offset:
            return -1
        stored_at_ms = self._store_time_at(queue, queue.min_offset)
        return -1 if stored_at_ms is None else stored_at_ms

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """REFERENCE.md §2.2 `getOffsetInQueueByTime`: binary search by store time over the queue's
        [min, max). An exact match returns the first message stored at `timestamp_ms`; otherwise the
        nearer of the last message before and the first after, ties to the earlier, the only side
        when one is missing; 0 for a missing or empty queue. (RocketMQ first narrows to one file
        by file mtime; a search over the whole queue gives the same answer for monotonic times.)"""
        queue = self._consume_queues.get(topic, queue_id)
        if queue is None or queue.min_offset >= queue.max_offset:
            return 0
        low, high = queue.min_offset, queue.max_offset       # first offset stored at >= timestamp_ms
        while low < high:
            middle = (low + high) // 2
            stored_at_ms = self._store_time_at(queue, middle)
            if stored_at_ms is not None and stored_at_ms < timestamp_ms:
                low = middle + 1
            else:
                high = middle
        if low == queue.max_offset:
            return low - 1
        after_ms = self._store_time_at(queue, low)
        if after_ms is None or after_ms == timestamp_ms or low == queue.min_offset:
            return low
        before_ms = self._store_time_at(queue, low - 1)
        if before_ms is None:
            return low
        return low - 1 if timestamp_ms - before_ms <= after_ms - timestamp_ms else low

    def _store_time_at(self, queue: ConsumeQueue, queue_offset: int) -> int | None:
        unit = queue.unit_at(queue_offset)
        if unit is None or unit[1] in (0, BLANK_SIZE):
            return None
        payload = self._commit_log.read_payload(unit[0], unit[1])
        if payload is None:
            return None
        try:
            return int(decode_stored_fields(payload)[F_STORE_TIMESTAMP])
        except (RecordError, TypeError, ValueError):
            return None

    def read_payload(self, commit_log_offset: int, size: int) -> memoryview | None:
        """The stored payload of the `size`-byte record at `commit_log_offset` (a consume-queue
        unit's two numbers), as a pull reads it; None when it is no longer there."""
        return self._commit_log.read_payload(commit_log_offset, size)

    def read_queue_units(self, topic: str, queue_id: int, queue_offset: int,
                         max_units: int) -> list[tuple[int, int, int]]:
        """Up to `max_units` consume-queue units `(commit_log_offset, size, tags_code)` from
        `queue_offset` (within one consume-queue file; [] when there are none). For the schedule
        service, whose units carry the due time in `tags_code`."""
        queue = self._consume_queues.get(topic, queue_id)
        if queue is None or not queue.min_offset <= queue_offset < queue.max_offset:
            return []
        units = queue.read_units(queue_offset, max_units)
        return [] if units is None else list(_CQ_UNITS(units))

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ms: int = 0,
                     end_ms: int = 0) -> list[memoryview | bytes]:
        """Stored payloads of `topic`'s messages with `key` in KEYS or as UNIQ_KEY, newest first
        (see `KeyIndex.query`); messages whose files were removed are left out, and so is a message
        the index holds under the key's hash that is not of this topic and key (a hash collision)."""
        found = (self.look_message_by_offset(o) for o in self.key_index.query(topic, key, max_num, begin_ms, end_ms))
        return [payload for payload in found if payload is not None and _has_key(payload, topic, key)]

    def look_message_by_offset(self, commit_log_offset: int) -> memoryview | bytes | None:
        """The stored payload of the record starting at `commit_log_offset` (checked: size, CRC and
        the payload's own offset field); None when no record starts there."""
        return self._commit_log.payload_at(commit_log_offset)

    def look_message_fields(self, commit_log_offset: int) -> list[Any] | None:
        """The 13 stored fields (`protocol.message` F_* positions) of the message starting at
        `commit_log_offset`: `look_message_by_offset` and `decode_stored_fields` in one decode (the
        offset field is checked on the decoded array). None when no message starts there."""
        payload = self._commit_log.intact_payload_at(commit_log_offset)
        if payload is None:
            return None
        try:
            fields = decode_stored_fields(payload)
        except RecordError:
            return None
        return fields if fields[F_COMMIT_LOG_OFFSET] == commit_log_offset else None

    def commit_log_max_offset(self) -> int:
        """The commit log's write position (end of the last record), in bytes."""
        return self._commit_log.max_offset

    def commit_log_min_offset(self) -> int:
        return self._commit_log.min_offset

    @property
    def reput_lag_bytes(self) -> int:
        """Commit-log bytes written but not yet dispatched to consume queues."""
        return self._reput.lag_bytes

    @property
    def flush_count(self) -> int:
        """Commit-log fsync rounds so far (group commit shares one among concurrent sends)."""
        return self._commit_log_flush.flush_count

    @property
    def commit_log_flushed_offset(self) -> int:
        """Every commit-log byte before this offset is fsynced."""
        return self._commit_log_flush.flushed_offset

    def set_fsync_observer(self, observer: Callable[[float], None] | None) -> None:
        """`observer(seconds)` after each commit-log fsync round (the fsync latency metric)."""
        self._commit_log_flush.on_fsync = observer

    def get_store_time(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """store_timestamp (epoch ms) of the message at `queue_offset`; None when there is none."""
        queue = self._consume_queues.get(topic, queue_id)
        return None if queue is None else self._store_time_at(queue, queue_offset)

    def queue_keys(self) -> list[tuple[str, int]]:
        """(topic, queue_id) of every consume queue that exists."""
        return list(self._consume_queues.queues)

