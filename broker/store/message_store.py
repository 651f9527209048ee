"""`MessageStore`: the facade the broker calls (RocketMQ `DefaultMessageStore`).

Puts and gets are synchronous and run to completion inside one event-loop step, so there is no put
lock and no torn read. Only the services are async: reput (consume queues + arrival listener),
commit-log flush (SYNC_FLUSH group commit or ASYNC_FLUSH), consume-queue flush + checkpoint.
Layout under `config.path`: `commitlog/`, `consumequeue/<topic>/<queue_id>/`, `checkpoint`, `abort`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgpack

from broker.schedule.delay_levels import clamp_level, deliver_at_ms, parse_delay_levels, queue_id_of
from broker.store.checkpoint import read_checkpoint
from broker.store.clean_service import CleanResult, CleanService
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import BLANK_SIZE, ConsumeQueue, ConsumeQueueTable, is_valid_topic_name
from broker.store.disk_guard import DiskGuard
from broker.store.flush import CommitLogFlushService, Settable, flush_consume_queues
from broker.store.key_index import KeyIndex, indexed_records
from broker.store.record import HEADER_BYTES, RecordError, decode_stored_fields, encode_run, payload_properties
from broker.store.recovery import recover_store
from broker.store.reput import ArrivalListener, ReputService, RunListener
from broker.store.results import (
    GetMessageResult,
    GetMessageStatus,
    MatchedOffsets,
    MessageFilter,
    PutMessageResult,
    PutMessageStatus,
)
from broker.store.segment import fdatasync_paths
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
    F_STORE_TIMESTAMP,
    F_SYS_FLAG,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
)
from protocol.service import PeriodicService
from protocol.subscription import tags_code
from protocol.topics import SCHEDULE_TOPIC

log = logging.getLogger(__name__)

T = TypeVar("T")

_CQ_UNITS = struct.Struct(">QIq").iter_unpack
_MIN_UNITS_EXAMINED = 800            # 16000 bytes of consume queue (RocketMQ maxFilterMessageCount)
_TAGS_CACHE_LIMIT = 4096


_TOTAL_RAM_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MessageStore:
    """Nothing touches the disk before `start()`; `stop()` leaves a clean store. Names follow the
    glossary: `commit_log_offset` is a byte position in the commit log, `queue_offset` an index in
    a consume queue."""

    def __init__(self, config: StoreConfig, *, store_host: str,
                 clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        self._config, self._store_host, self._clock_ms = config, store_host, clock_ms
        root = config.path
        self._abort_path, self._checkpoint_path = root / "abort", root / "checkpoint"
        self.delay_levels = parse_delay_levels(config.message_delay_level)
        self._commit_log = CommitLog(root / "commitlog", config.commit_log_segment_bytes)
        self._consume_queues = ConsumeQueueTable(root / "consumequeue", config.consume_queue_segment_units)
        self._reput = ReputService(self._commit_log, self._consume_queues, tags_code, self.delay_levels)
        self._commit_log_flush = CommitLogFlushService(
            self._commit_log, sync_flush=config.flush_disk_type == "SYNC_FLUSH",
            flush_interval_ms=config.flush_interval_ms, sync_flush_timeout_ms=config.sync_flush_timeout_ms)
        self._consume_queue_flush = PeriodicService(
            "consume-queue-flush", config.flush_consume_queue_interval_ms, self._flush_consume_queues)
        self.disk_guard = DiskGuard(warning_ratio_percent=config.disk_space_warning_level_ratio,
                                    min_free_bytes=config.commit_log_segment_bytes)
        self._commit_log_flush.on_error = self.disk_guard.write_failed
        self._clean = CleanService(config, self._commit_log, self._consume_queues, self.disk_guard,
                                   safe_end=self._retention_safe_end, clock_ms=clock_ms,
                                   after_check=self._retry_rebuild)
        self._rebuilding: str | None = None     # why sends are refused until the start-up rebuild ends
        self._checkpoint_failed = False
        self._topic_queue_table: dict[tuple[str, int], int] = {}
        self._tags_cache: dict[str, int] = {}
        self.key_index = KeyIndex(config.key_index_max_entries)
        self._reput.key_index = self.key_index
        self._packer = msgpack.Packer(use_bin_type=True)
        self._running = False

    # lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover (REFERENCE.md §4.5, see `recovery.py`), re-dispatch the backlog (before returning,
        as RocketMQ's start blocks until the dispatch backlog is zero), create the `abort` marker,
        then start reput and the flush services."""
        if self._running:
            raise RuntimeError("store already started")
        root = self._config.path
        root.mkdir(parents=True, exist_ok=True)
        crashed = self._abort_path.exists()
        checkpoint = read_checkpoint(self._checkpoint_path)
        recovered = await asyncio.to_thread(
            recover_store, self._commit_log, self._consume_queues, checkpoint, crashed=crashed)
        end = recovered.commit_log_end
        # the room a new commit-log file needs: the store's own file size (kept from its creation)
        self.disk_guard.min_free_bytes = self._commit_log.segment_bytes
        # the key index lives in memory: rebuild it from what reput will not dispatch again
        await asyncio.to_thread(self.key_index.rebuild, indexed_records(
            self._commit_log, self._commit_log.min_offset, recovered.reput_from_offset))
        self._reput.begin(recovered.reput_from_offset, end)
        rebuilt = await self._rebuild_consume_queues()
        if crashed:     # make the truncation of a torn tail durable before anything is appended
            await asyncio.to_thread(fdatasync_paths, self._commit_log.flush_paths(end - 1, end + 1))
        self._commit_log_flush.begin(end)
        self._abort_path.touch()
        if rebuilt:
            await self._reput.start()
        await self._commit_log_flush.start()
        await self._consume_queue_flush.start()
        await self._clean.check_disk()
        await self._clean.start()
        self._running = True

    async def _rebuild_consume_queues(self) -> bool:
        """Dispatch the backlog recovery found (in a thread; RocketMQ's start blocks on it too),
        then take each queue's next offset. A file system error (a full disk: a consume-queue file
        cannot be created or extended) does not stop the start: the store serves pulls of what is
        dispatched and refuses sends (SERVICE_NOT_AVAILABLE, saying why) until a later disk check
        finds the rebuild can go on (`_retry_rebuild`). False while it could not finish."""
        try:
            await asyncio.to_thread(self._reput.dispatch_available, notify=False)
        except OSError as exc:
            if self._rebuilding is None:
                log.error("store read-only for sends: consume queues rebuilt up to commit-log offset %d of %d "
                          "(%s); the rest follows once the disk has room", self._reput.reput_from_offset,
                          self._commit_log.max_offset, exc)
            self._rebuilding = self.disk_guard.write_failed(exc, "rebuilding the consume queues at start")
            return False
        self._rebuilding = None
        self._topic_queue_table = {key: queue.max_offset for key, queue in self._consume_queues.queues.items()}
        return True

    async def _retry_rebuild(self) -> None:
        """After each disk check: go on with a start-up rebuild a full disk stopped, and once it is
        done start reput and take sends again."""
        if self._rebuilding is not None and self._running and await self._rebuild_consume_queues():
            log.warning("consume queues rebuilt to commit-log offset %d: accepting sends again",
                        self._reput.reput_from_offset)
            await self._reput.start()

    async def stop(self) -> None:
        """Stop accepting puts, drain reput to the log end, flush everything, write the checkpoint,
        remove the `abort` marker and unmap the files. A checkpoint that cannot be written (a full
        disk) is logged and the `abort` marker kept: the next start recovers as after a crash."""
        await self._shutdown(clean=True)

    async def _shutdown(self, *, clean: bool) -> None:
        """`clean=False` stops like a killed process (tests): nothing more is dispatched, flushed or
        checkpointed and `abort` stays; what is in the page cache survives, as after `kill -9`."""
        if not self._running:
            return
        self._running = False
        await self._clean.stop()
        await self._consume_queue_flush.stop()
        if not clean:
            self._reput.abandon()
        await self._reput.stop()
        await self._commit_log_flush.stop()
        if clean:
            await self._commit_log_flush.flush()
            await self._flush_consume_queues()
            if not self._checkpoint_failed:
                self._abort_path.unlink(missing_ok=True)
        self._consume_queues.close()
        self._commit_log.close()

    async def _flush_consume_queues(self) -> None:
        """fsync the consume queues and write the checkpoint; a failure (ENOSPC, EIO) is logged once
        until a later round succeeds, never raised: recovery does without a fresh checkpoint."""
        try:
            await flush_consume_queues(
                self._consume_queues, reput_offset=self._reput.reput_from_offset,
                commit_log_flushed_offset=self._commit_log_flush.flushed_offset,
                written_at_ms=self._clock_ms(), checkpoint_path=self._checkpoint_path)
        except OSError as exc:
            if not self._checkpoint_failed:
                log.error("consume-queue flush or checkpoint failed (%s); retrying every %d ms", exc,
                          self._config.flush_consume_queue_interval_ms)
            self._checkpoint_failed = True
            return
        if self._checkpoint_failed:
            log.warning("consume queues flushed and checkpoint written again")
        self._checkpoint_failed = False

    def _retention_safe_end(self) -> int:
        """Commit-log bytes before this are flushed and dispatched: retention may delete them."""
        return min(self._commit_log_flush.flushed_offset, self._reput.reput_from_offset)

    async def clean_now(self) -> CleanResult:
        """Flush consume queues, sample the disk, run one retention round (tests and tools;
        normally every `clean_resource_interval_ms`)."""
        await self._flush_consume_queues()
        return self._clean.clean(await self._clean.check_disk())

    async def check_disk(self) -> None:
        """Sample disk use now (tests; normally every `disk_check_interval_ms`)."""
        await self._clean.check_disk()

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
                            born_timestamp: int, born_host: str, reconsume_times: int) -> PutMessageResult:
        """`put_message` for a caller that has already checked the message as `_put` would: a topic
        name matching `^[%|a-zA-Z0-9_-]+$`, `0 <= queue_id`, `len(body) <= max_message_bytes` and no
        `DELAY` property (the broker's usual one-at-a-time send, whose topic, queue and group passed
        these checks under the current topic configs). Only the store's own state is checked
        (running, the disk guard's refusal): the statuses and record bytes are `put_message`'s."""
        refused = self._not_writable()
        if refused is not None:
            return refused
        return self._put_one(topic, queue_id, (properties, flag, body), born_timestamp, born_host, reconsume_times, 0)

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
                             born_timestamp: int, born_host: str) -> PutMessageResult:
        """`put_messages` for a caller that has already checked the batch as `_put` would: at least
        one message, a topic name matching `^[%|a-zA-Z0-9_-]+$`, `0 <= queue_id` and every body of
        at most `max_message_bytes` (the broker's SEND_BATCH_MESSAGE, whose body `decode_batch`
        and whose topic and queue the send processor checked). Only the store's own state is
        checked (running, the disk guard's refusal): the statuses and record bytes are
        `put_messages`'s."""
        refused = self._not_writable()
        if refused is not None:
            return refused
        if len(messages) == 1:
            return self._put_one(topic, queue_id, messages[0], born_timestamp, born_host, 0, 0)
        return self._put_run(topic, queue_id, messages, born_timestamp, born_host, 0, 0, None)

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
        try:
            if origins is None:      # the usual batch: records encoded in runs, in C when built
                head = (topic, queue_id, sys_flag, born_timestamp, born_host, store_timestamp, self._store_host,
                        reconsume_times)
                written = commit_log.append_run(len(messages), lambda start, position, limit: encode_run(
                    head, messages, start, first_queue_offset, position, limit))
            else:
                written = commit_log.append_batch(len(messages), self._origin_encoder(
                    topic, queue_id, messages, origins, first_queue_offset, store_timestamp))
        except OSError as exc:                   # ENOSPC/EIO creating a segment: nothing written
            return self._refused(PutMessageStatus.SERVICE_NOT_AVAILABLE, self._segment_failed(exc))
        if written is None:
            return self._refused(PutMessageStatus.MESSAGE_ILLEGAL)
        self._commit_log_flush.appended(commit_log.max_offset)
        offsets, sizes = written
        self._topic_queue_table[key] = first_queue_offset + len(messages)
        tags_cache = self._tags_cache
        codes: list[int] = []
        schedule = topic == SCHEDULE_TOPIC
        for properties, _, _ in messages:
            tag = properties.get(PROPERTY_TAGS)
            code = tags_cache.get(tag) if tag else 0
            if code is None:
                code = self._tags_code(tag)
            if schedule:        # the due time stands in the tags code (RocketMQ, REFERENCE.md §10)
                code = deliver_at_ms(store_timestamp, queue_id + 1, self.delay_levels)
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
        return self._rebuilding or self.disk_guard.refusal

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

    def _segment_failed(self, exc: OSError) -> str:
        """Tell the disk guard a new commit-log file could not be made; the refusal's remark."""
        return self.disk_guard.write_failed(exc, "creating a commit-log file")

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
        properties, flag, body = message
        key = (topic, queue_id)
        queue_offset = self._topic_queue_table.get(key, 0)
        store_timestamp = self._clock_ms()
        pack, store_host = self._packer.pack, self._store_host

        def encode(commit_log_offset: int) -> bytes:
            payload: bytes = pack([topic, queue_id, queue_offset, commit_log_offset, flag, sys_flag, born_timestamp,
                                   born_host, store_timestamp, store_host, reconsume_times, properties, body])
            return payload

        refused = self._reserve_unit(topic, queue_id, queue_offset, 1)
        if refused is not None:
            return refused
        try:
            written = commit_log.append_one(encode)
        except OSError as exc:                   # ENOSPC/EIO creating a segment: nothing written
            return self._refused(PutMessageStatus.SERVICE_NOT_AVAILABLE, self._segment_failed(exc))
        if written is None:
            return self._refused(PutMessageStatus.MESSAGE_ILLEGAL)
        self._commit_log_flush.appended(commit_log.max_offset)
        commit_log_offset, size = written
        self._topic_queue_table[key] = queue_offset + 1
        tag = properties.get(PROPERTY_TAGS)
        if topic == SCHEDULE_TOPIC:     # the due time stands in the tags code (RocketMQ, REFERENCE.md §10)
            code = deliver_at_ms(store_timestamp, queue_id + 1, self.delay_levels)
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

    async def flush(self) -> None:
        """fsync the commit log up to its current end now (both flush types); used before state
        that depends on durable records (the schedule service's delivery offsets) is persisted."""
        await self._commit_log_flush.flush()

    @property
    def flushed_offset(self) -> int:
        """Every commit-log byte before this is on disk."""
        return self._commit_log_flush.flushed_offset

    def is_durable(self, commit_log_end_offset: int) -> bool:
        """True when a put ending at `commit_log_end_offset` needs no wait: ASYNC_FLUSH, or already
        fsynced (`wait_flushed` would return at once)."""
        flush = self._commit_log_flush
        return not flush.sync_flush or commit_log_end_offset <= flush.flushed_offset

    async def wait_flushed(self, commit_log_end_offset: int) -> None:
        """SYNC_FLUSH: return once fsynced up to `commit_log_end_offset` (a put's `end_offset`),
        sharing the fsync with concurrent puts; raises `FlushDiskTimeoutError` after
        `sync_flush_timeout_ms`. ASYNC_FLUSH: returns at once."""
        await self._commit_log_flush.wait_flushed(commit_log_end_offset)

    def resolve_when_flushed(self, commit_log_end_offset: int, future: Settable[T], value: T) -> None:
        """SYNC_FLUSH: `future.set_result(value)` once fsynced up to `commit_log_end_offset`, or
        `FlushDiskTimeoutError` after `sync_flush_timeout_ms` (see `wait_flushed`); for a caller
        that answers from the future's callback instead of awaiting (the send path)."""
        self._commit_log_flush.resolve_when_flushed(commit_log_end_offset, future, value)

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
        (see `KeyIndex.query`); messages whose files were removed are left out."""
        found = (self.look_message_by_offset(o) for o in self.key_index.query(topic, key, max_num, begin_ms, end_ms))
        return [payload for payload in found if payload is not None]

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

    def set_arrival_listener(self, listener: ArrivalListener | None, run_listener: RunListener | None = None) -> None:
        """`listener(topic, queue_id, max_offset, tags_code, properties)`, called by reput after each
        message is in its consume queue (the long-polling hold service's notify). With
        `run_listener(topic, queue_id, queue_offset, units, properties)`, a batch dispatched as
        one run is told once instead (see `reput.RunListener`)."""
        self._reput.listener = listener
        self._reput.run_listener = run_listener

    def dispatch_available(self) -> int:
        """Dispatch every appended message to its consume queue now (tests; normally reput does
        this within one loop iteration of the put). Returns how many."""
        return self._reput.dispatch_available()

