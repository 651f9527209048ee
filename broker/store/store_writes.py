"""`StoreWrites`: the write side of `MessageStore` (RocketMQ `CommitLog#putMessage(s)` with
`DefaultMessageStore`'s checks): single, batch and scheduled puts appended to the commit log as one
run, the consume-queue unit reserved first (so a full disk refuses a put before anything is
written), delayed messages redirected to `SCHEDULE_TOPIC_XXXX`, and the refusals (a read-only
start-up rebuild, a full disk, a bad topic) as `PutMessageResult`s. A mixin of `MessageStore`, which
owns the files it writes (declared below); puts are synchronous and run within one loop step, so
there is no put lock."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import msgpack

from broker.schedule.delay_levels import clamp_level, deliver_at_ms, queue_id_of
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import ConsumeQueueTable, is_valid_topic_name
from broker.store.disk_guard import DiskGuard
from broker.store.flush import CommitLogFlushService
from broker.store.record import encode_run
from broker.store.reput import ReputService
from broker.store.results import (
    PutMessageResult,
    PutMessageStatus,
)
from broker.timer.deliver_time import timer_due_of
from conf.store import StoreConfig
from protocol.message import (
    F_BODY,
    F_BORN_HOST,
    F_BORN_TIMESTAMP,
    F_COMMIT_LOG_OFFSET,
    F_FLAG,
    F_PROPERTIES,
    F_QUEUE_OFFSET,
    F_RECONSUME_TIMES,
    F_SYS_FLAG,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
)
from protocol.subscription import tags_code
from protocol.topics import SCHEDULE_TOPIC, TIMER_TOPIC

log = logging.getLogger(__name__)
P = ParamSpec("P")
W = TypeVar("W")
_TAGS_CACHE_LIMIT = 4096


class StoreWrites:
    """Puts into a `MessageStore`'s commit log (see the module doc)."""

    _config: StoreConfig
    _store_host: str
    _clock_ms: Callable[[], int]
    _commit_log: CommitLog
    _consume_queues: ConsumeQueueTable
    _reput: ReputService
    _commit_log_flush: CommitLogFlushService
    _topic_queue_table: dict[tuple[str, int], int]
    _tags_cache: dict[str, int]
    _packer: msgpack.Packer
    _running: bool
    _rebuilding: str | None
    on_appended: Callable[[], None] | None
    read_only: str | None
    delay_levels: tuple[int, ...]
    disk_guard: DiskGuard

    # put -------------------------------------------------------------------------------------

    def put_message(self, *, topic: str, queue_id: int, body: bytes, properties: dict[str, str], flag: int,
                    born_timestamp: int, born_host: str, reconsume_times: int = 0,
                    sys_flag: int = 0) -> PutMessageResult:
        """Append one message (see `put_messages`).

        A message with a `DELAY` property > 0 (a delay level, clamped to the number of levels of
        `message_delay_level`) is stored in `SCHEDULE_TOPIC_XXXX`, queue `level - 1`, with
        `REAL_TOPIC` / `REAL_QID` naming where the schedule service delivers it when due; its
        consume-queue unit holds the due time (epoch ms) in place of the tags code. RocketMQ
        `CommitLog#putMessage` (REFERENCE.md §10). A `DELAY` that is not an integer is
        MESSAGE_ILLEGAL; 0 or less means no delay."""
        if PROPERTY_DELAY_TIME_LEVEL in properties and topic != SCHEDULE_TOPIC:
            try:
                level = clamp_level(int(properties[PROPERTY_DELAY_TIME_LEVEL]), self.delay_levels)
            except ValueError:
                return self._refused(PutMessageStatus.MESSAGE_ILLEGAL)
            if level > 0:
                properties = {**properties, PROPERTY_DELAY_TIME_LEVEL: str(level),
                              PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: str(queue_id)}
                topic, queue_id = SCHEDULE_TOPIC, queue_id_of(level)
        return self._put(topic, queue_id, ((properties, flag, body),), born_timestamp, born_host,
                         reconsume_times, sys_flag)

    def put_checked_message(self, *, topic: str, queue_id: int, body: bytes, properties: dict[str, str], flag: int,
                            born_timestamp: int, born_host: str, reconsume_times: int,
                            sys_flag: int = 0) -> PutMessageResult:
        """`put_message` for a caller that has already checked the message as `_put` would: a topic
        name matching `^[%|a-zA-Z0-9_-]+$`, `0 <= queue_id`, `len(body) <= max_message_bytes` and no
        `DELAY` property (the broker's usual one-at-a-time send, whose topic, queue and group passed
        these checks under the current topic configs). Only the store's own state is checked
        (running, the disk guard's refusal): the statuses and record bytes are `put_message`'s."""
        refusal = self.write_refusal        # (`_not_writable` without its frame: once per single send)
        if refusal is not None:
            return self._refused(PutMessageStatus.SERVICE_NOT_AVAILABLE, refusal)
        return self._put_one(topic, queue_id, (properties, flag, body), born_timestamp, born_host, reconsume_times,
                             sys_flag)

    def put_messages(self, *, topic: str, queue_id: int,
                     messages: Sequence[tuple[dict[str, str], int, bytes]], born_timestamp: int,
                     born_host: str) -> PutMessageResult:
        """Append a batch of (properties, flag, body) to one queue with consecutive queue offsets
        from the queue's next one; store_timestamp is the clock now. MESSAGE_ILLEGAL (nothing
        written) for an empty batch, a topic name outside `^[%|a-zA-Z0-9_-]+$`, a negative queue_id
        or any body over `max_message_bytes`; SERVICE_NOT_AVAILABLE unless started. The messages
        become readable once reput has dispatched them; durable after `wait_flushed(end_offset)`."""
        return self._put(topic, queue_id, messages, born_timestamp, born_host, 0, 0)

    def put_checked_messages(self, *, topic: str, queue_id: int, messages: list[tuple[dict[str, str], int, bytes]],
                             born_timestamp: int, born_host: str, reconsume_times: int = 0,
                             sys_flag: int = 0) -> PutMessageResult:
        """`put_messages` for a caller that has already checked the batch as `_put` would: at least
        one message, a topic name matching `^[%|a-zA-Z0-9_-]+$`, `0 <= queue_id` and every body of
        at most `max_message_bytes` (the broker's SEND_BATCH_MESSAGE, whose body `decode_batch`
        and whose topic and queue the send processor checked). Only the store's own state is
        checked (running, the disk guard's refusal): the statuses and record bytes are
        `put_messages`'s. `reconsume_times` and `sys_flag` are every message's (the transaction
        bridge writes commits with sys_flag COMMIT this way)."""
        refused = self._not_writable()
        if refused is not None:
            return refused
        if len(messages) == 1:
            return self._put_one(topic, queue_id, messages[0], born_timestamp, born_host, reconsume_times, sys_flag)
        return self._put_run(topic, queue_id, messages, born_timestamp, born_host, reconsume_times, sys_flag, None)

    def put_scheduled(self, *, topic: str, queue_id: int, messages: Sequence[tuple[dict[str, str], int, bytes]],
                      origins: Sequence[tuple[int, str, int, int]]) -> PutMessageResult:
        """Append messages that keep their own origin: `origins[i]` is message i's (born_timestamp,
        born_host, reconsume_times, sys_flag). The schedule service delivers due messages to their
        real queue this way, one append for a run of them (see `put_messages` for the statuses)."""
        return self._put(topic, queue_id, messages, 0, "", 0, 0, origins)

    def _put(self, topic: str, queue_id: int, messages: Sequence[tuple[dict[str, str], int, bytes]],
             born_timestamp: int, born_host: str, reconsume_times: int, sys_flag: int,
             origins: Sequence[tuple[int, str, int, int]] | None = None) -> PutMessageResult:
        refused = self._not_writable()
        if refused is not None:
            return refused
        max_bytes = self._config.max_message_bytes
        if not messages or queue_id < 0 or not is_valid_topic_name(topic):
            return self._refused(PutMessageStatus.MESSAGE_ILLEGAL)
        for _, _, body in messages:
            if len(body) > max_bytes:
                return self._refused(PutMessageStatus.MESSAGE_ILLEGAL)
        if len(messages) == 1 and origins is None:
            return self._put_one(topic, queue_id, messages[0], born_timestamp, born_host, reconsume_times, sys_flag)
        return self._put_run(topic, queue_id, messages, born_timestamp, born_host, reconsume_times, sys_flag, origins)

    def _put_run(self, topic: str, queue_id: int, messages: Sequence[tuple[dict[str, str], int, bytes]],
                 born_timestamp: int, born_host: str, reconsume_times: int, sys_flag: int,
                 origins: Sequence[tuple[int, str, int, int]] | None) -> PutMessageResult:
        """`_put` of checked messages (more than one, or scheduled ones with their origins)."""
        commit_log = self._commit_log
        key = (topic, queue_id)
        first_queue_offset = self._topic_queue_table.get(key, 0)
        store_timestamp = self._clock_ms()
        refused = self._reserve_unit(topic, queue_id, first_queue_offset, len(messages))
        if refused is not None:
            return refused
        if origins is None:      # the usual batch: records encoded in runs, in C when built
            head = (topic, queue_id, sys_flag, born_timestamp, born_host, store_timestamp, self._store_host,
                    reconsume_times)
            written = self._append(commit_log.append_run, len(messages), lambda start, position, limit: encode_run(
                head, messages, start, first_queue_offset, position, limit))
        else:
            written = self._append(commit_log.append_batch, len(messages), self._origin_encoder(
                topic, queue_id, messages, origins, first_queue_offset, store_timestamp))
        if isinstance(written, PutMessageResult):
            return written
        offsets, sizes = written
        self._topic_queue_table[key] = first_queue_offset + len(messages)
        tags_cache = self._tags_cache
        codes: list[int] = []
        schedule = topic == SCHEDULE_TOPIC
        timer = topic == TIMER_TOPIC
        for properties, _, _ in messages:
            tag = properties.get(PROPERTY_TAGS)
            code = tags_cache.get(tag) if tag else 0
            if code is None:
                code = self._tags_code(tag)
            if schedule:        # the due time stands in the tags code (RocketMQ, REFERENCE.md §10)
                code = deliver_at_ms(store_timestamp, queue_id + 1, self.delay_levels)
            elif timer:         # so does a timer message's (TIMER_OUT_MS)
                code = timer_due_of(properties)
            codes.append(code)
        self._reput.hand_off_run(topic, queue_id, first_queue_offset, list(zip(offsets, sizes, codes, strict=True)),
                                 store_timestamp, [properties for properties, _, _ in messages])
        return PutMessageResult(PutMessageStatus.PUT_OK, first_queue_offset, offsets, commit_log.max_offset)

    def _origin_encoder(self, topic: str, queue_id: int, messages: Sequence[tuple[dict[str, str], int, bytes]],
                        origins: Sequence[tuple[int, str, int, int]], first_queue_offset: int,
                        store_timestamp: int) -> Callable[[int, int], bytes]:
        """`encode(index, commit_log_offset)` for `put_scheduled`: message `index` with its own
        origin (born_timestamp, born_host, reconsume_times, sys_flag), as the array of
        `protocol.message.encode_stored_message`, packed with one reusable Packer (the same bytes,
        a test checks it, at half the cost of a `packb` per message)."""
        fields: list[Any] = [topic, queue_id, 0, 0, 0, 0, 0, "", store_timestamp, self._store_host, 0, None, None]
        pack = self._packer.pack

        def encode(index: int, commit_log_offset: int) -> bytes:
            (fields[F_BORN_TIMESTAMP], fields[F_BORN_HOST], fields[F_RECONSUME_TIMES],
             fields[F_SYS_FLAG]) = origins[index]
            fields[F_PROPERTIES], fields[F_FLAG], fields[F_BODY] = messages[index]
            fields[F_QUEUE_OFFSET] = first_queue_offset + index
            fields[F_COMMIT_LOG_OFFSET] = commit_log_offset
            payload: bytes = pack(fields)
            return payload
        return encode

    @property
    def write_refusal(self) -> str | None:
        """Why puts are refused now (SERVICE_NOT_AVAILABLE's remark), None while the store takes
        them: callers check it before creating anything for a put (an auto-created topic)."""
        if not self._running:
            return "the store is not running (starting or stopping)"
        return self.read_only or self._rebuilding or self.disk_guard.refusal

    def _not_writable(self) -> PutMessageResult | None:
        """SERVICE_NOT_AVAILABLE (nothing written) while the store is not running or the disk guard
        refuses sends (or the start-up rebuild waits for space); None when a put may go ahead."""
        refusal = self.write_refusal
        if refusal is not None:
            return self._refused(PutMessageStatus.SERVICE_NOT_AVAILABLE, refusal)
        return None

    def _refused(self, status: PutMessageStatus, remark: str = "") -> PutMessageResult:
        """The result of a put that wrote nothing."""
        return PutMessageResult(status, -1, [], self._commit_log.max_offset, remark)

    def _append(self, append: Callable[P, W | None], *args: P.args, **kwargs: P.kwargs) -> W | PutMessageResult:
        """`append(*args, **kwargs)`, a commit-log append: what it wrote (announced to the flush
        service), or the refusal when it wrote nothing: SERVICE_NOT_AVAILABLE when a new commit-log
        file could not be made (ENOSPC/EIO; the disk guard is told), MESSAGE_ILLEGAL when `append`
        gives None."""
        try:
            written = append(*args, **kwargs)
        except OSError as exc:
            return self._refused(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                 self.disk_guard.write_failed(exc, "creating a commit-log file"))
        if written is None:
            return self._refused(PutMessageStatus.MESSAGE_ILLEGAL)
        self._commit_log_flush.appended(self._commit_log.max_offset)
        if self.on_appended is not None:
            self.on_appended()
        return written

    def _reserve_unit(self, topic: str, queue_id: int, queue_offset: int, count: int) -> PutMessageResult | None:
        """Disk blocks for the consume-queue units of a put, before its records are appended (a
        unit written later into a page the disk cannot back would be a SIGBUS): None when they are
        there (an integer comparison, but for one file system call per 3,276 units), else the
        SERVICE_NOT_AVAILABLE result, nothing written, and the disk guard refuses sends."""
        try:
            self._consume_queues.get_or_create(topic, queue_id).reserve(queue_offset, count)
        except OSError as exc:
            return self._refused(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                 self.disk_guard.write_failed(exc, f"extending consume queue {topic}:{queue_id}"))
        return None

    def _put_one(self, topic: str, queue_id: int, message: tuple[dict[str, str], int, bytes], born_timestamp: int,
                 born_host: str, reconsume_times: int, sys_flag: int) -> PutMessageResult:
        """`_put` of one message, checks done: the one-at-a-time send path (no per-batch lists,
        closures over a shared field array or batch hand-off). Same record bytes as `_put`."""
        commit_log = self._commit_log
        properties = message[0]
        key = (topic, queue_id)
        queue_offset = self._topic_queue_table.get(key, 0)
        store_timestamp = self._clock_ms()
        queue = self._consume_queues.queues.get(key)
        if queue is None or queue_offset >= queue.allocated_units:      # (`reserve`'s test, inline)
            refused = self._reserve_unit(topic, queue_id, queue_offset, 1)
            if refused is not None:
                return refused
        written = self._append(commit_log.append_record, (topic, queue_id, sys_flag, born_timestamp, born_host,
                               store_timestamp, self._store_host, reconsume_times), queue_offset, message)
        if isinstance(written, PutMessageResult):
            return written
        commit_log_offset, size = written
        self._topic_queue_table[key] = queue_offset + 1
        tag = properties.get(PROPERTY_TAGS)
        if topic == SCHEDULE_TOPIC:     # the due time stands in the tags code (RocketMQ, REFERENCE.md §10)
            code = deliver_at_ms(store_timestamp, queue_id + 1, self.delay_levels)
        elif topic == TIMER_TOPIC:
            code = timer_due_of(properties)
        elif not tag:
            code = 0
        else:
            code = self._tags_cache.get(tag) or self._tags_code(tag)
        self._reput.hand_off_one(topic, queue_id, queue_offset, commit_log_offset, size, code, store_timestamp,
                                 properties)
        return PutMessageResult(PutMessageStatus.PUT_OK, queue_offset, [commit_log_offset], commit_log.max_offset)

    def _tags_code(self, tag: str | None) -> int:
        if not tag:
            return 0
        code = self._tags_cache.get(tag)
        if code is None:
            if len(self._tags_cache) >= _TAGS_CACHE_LIMIT:
                self._tags_cache.clear()
            code = self._tags_cache[tag] = tags_code(tag)
        return code

