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
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import msgpack

from broker.schedule.delay_levels import parse_delay_levels
from broker.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from broker.store.clean_service import CleanResult, CleanService
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import ConsumeQueueTable
from broker.store.dedup import DedupIndex
from broker.store.disk_guard import DiskGuard
from broker.store.flush import CommitLogFlushService, Settable, flush_consume_queues
from broker.store.key_index import KeyIndex, indexed_records
from broker.store.recovery import recover_store
from broker.store.reput import ArrivalListener, ReputService, RunListener
from broker.store.segment import fdatasync_paths
from broker.store.store_reads import StoreReads
from broker.store.store_writes import StoreWrites
from conf.store import StoreConfig
from protocol.service import PeriodicService
from protocol.subscription import tags_code

log = logging.getLogger(__name__)

T = TypeVar("T")

_CQ_UNITS = struct.Struct(">QIq").iter_unpack
_MIN_UNITS_EXAMINED = 800            # 16000 bytes of consume queue (RocketMQ maxFilterMessageCount)
_TAGS_CACHE_LIMIT = 4096


_TOTAL_RAM_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplicaGate(Protocol):
    """What a SYNC_MASTER's sends wait on besides the local flush (`broker.ha.sync_gate`)."""

    def is_acked(self, end_offset: int) -> bool: ...

    def resolve_when_acked(self, end_offset: int, future: Settable[Any], value: Any) -> None: ...


class _ThenReplicated:
    """The `Settable` a flush resolves to hand its value on to the replica gate."""

    __slots__ = ("_end_offset", "_future", "_gate")

    def __init__(self, gate: ReplicaGate, end_offset: int, future: Settable[Any]) -> None:
        self._gate, self._end_offset, self._future = gate, end_offset, future

    def done(self) -> bool:
        return self._future.done()

    def set_result(self, value: Any, /) -> None:
        self._gate.resolve_when_acked(self._end_offset, self._future, value)

    def set_exception(self, exc: BaseException, /) -> None:
        self._future.set_exception(exc)


class MessageStore(StoreWrites, StoreReads):
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
        self.dedup = DedupIndex(config.dedup_window_ms, config.dedup_max_entries)
        self._reput.key_index = self.key_index
        self._packer = msgpack.Packer(use_bin_type=True)
        self._running = False
        self.replica_gate: ReplicaGate | None = None       # SYNC_MASTER: sends also wait for slaves
        self.on_appended: Callable[[], None] | None = None  # a master's replication streams are woken
        self.read_only: str | None = None                  # SLAVE: why sends are refused

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
        # so is the dedup index (store.dedup_window_ms): from the DEDUP sends the commit log kept
        await asyncio.to_thread(self.dedup.rebuild, self._commit_log, self._commit_log.min_offset, end)
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

    def take_writes(self) -> None:
        """A slave becoming master: dispatch everything it copied, then continue each queue's
        offsets from its consume queue (the put path's own table stopped at the slave's start)."""
        self._reput.dispatch_available()
        self._topic_queue_table = {key: queue.max_offset for key, queue in self._consume_queues.queues.items()}

    async def truncate_to(self, commit_log_offset: int) -> None:
        """Drop every commit-log byte at or after `commit_log_offset` (a record boundary), with the
        consume-queue units and key-index entries of those records: a deposed master fenced as a
        slave cuts the tail the new master never had (RocketMQ `truncateDirtyFiles` on an
        AutoSwitchHAClient's truncation). The store stops (cleanly), the log is cut and the
        checkpoint lowered, then it starts again (recovery trims the consume queues). Sends are
        refused meanwhile; the caller is a slave, which takes none. Raises `OSError`."""
        await self.stop()
        checkpoint = read_checkpoint(self._checkpoint_path)

        def cut() -> None:
            self._commit_log.load()
            self._commit_log.truncate_tail(commit_log_offset)
            self._commit_log.close()
            if checkpoint is not None:
                write_checkpoint(self._checkpoint_path, Checkpoint(
                    commit_log_flushed_offset=min(checkpoint.commit_log_flushed_offset, commit_log_offset),
                    reput_offset=min(checkpoint.reput_offset, commit_log_offset),
                    written_at_ms=checkpoint.written_at_ms))
        await asyncio.to_thread(cut)
        self.key_index = self._reput.key_index = KeyIndex(self._config.key_index_max_entries)
        log.warning("commit log truncated at %d (records the master of the new epoch never had)", commit_log_offset)
        await self.start()

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
        gate = self.replica_gate
        return ((not flush.sync_flush or commit_log_end_offset <= flush.flushed_offset)
                and (gate is None or gate.is_acked(commit_log_end_offset)))

    async def wait_flushed(self, commit_log_end_offset: int) -> None:
        """SYNC_FLUSH: return once fsynced up to `commit_log_end_offset` (a put's `end_offset`),
        sharing the fsync with concurrent puts; raises `FlushDiskTimeoutError` after
        `sync_flush_timeout_ms`. ASYNC_FLUSH: returns at once."""
        await self._commit_log_flush.wait_flushed(commit_log_end_offset)

    def resolve_when_fsynced(self, commit_log_end_offset: int, future: Settable[T], value: T) -> None:
        """`future.set_result(value)` once the commit log is fsynced up to `commit_log_end_offset`
        (at once under ASYNC_FLUSH or when it already is), else `FlushDiskTimeoutError` after
        `sync_flush_timeout_ms`; the replica gate is never asked (a slave acknowledging its copy)."""
        flush = self._commit_log_flush
        if not flush.sync_flush or commit_log_end_offset <= flush.flushed_offset:
            future.set_result(value)
        else:
            flush.resolve_when_flushed(commit_log_end_offset, future, value)

    def resolve_when_flushed(self, commit_log_end_offset: int, future: Settable[T], value: T) -> None:
        """SYNC_FLUSH: `future.set_result(value)` once fsynced up to `commit_log_end_offset`, or
        `FlushDiskTimeoutError` after `sync_flush_timeout_ms` (see `wait_flushed`); for a caller
        that answers from the future's callback instead of awaiting (the send path).
        With a `replica_gate` (SYNC_MASTER) the value is then handed to the gate, which resolves
        the future once enough slaves have the bytes too (RocketMQ's GroupTransferService after
        GroupCommitService), or sets SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT."""
        gate, flush = self.replica_gate, self._commit_log_flush
        if gate is None:
            flush.resolve_when_flushed(commit_log_end_offset, future, value)
        elif not flush.sync_flush or commit_log_end_offset <= flush.flushed_offset:
            gate.resolve_when_acked(commit_log_end_offset, future, value)
        else:
            flush.resolve_when_flushed(commit_log_end_offset, _ThenReplicated(gate, commit_log_end_offset, future),
                                       value)

    def append_replicated(self, commit_log_offset: int, data: bytes | memoryview) -> int:
        """A slave: write a master's commit-log bytes at the same offset (see
        `CommitLog.append_replicated`, which raises `ValueError` / `OSError`), then have reput
        dispatch them from disk into this store's own consume queues and index. Returns the new
        commit-log end (what the slave acknowledges once it is flushed)."""
        commit_log = self._commit_log
        commit_log.append_replicated(commit_log_offset, data)
        reput = self._reput
        if reput.reput_from_offset < commit_log.min_offset:    # a new slave starting at the master's first file
            reput.begin(commit_log.min_offset, commit_log.min_offset)
        reput.extend_from_disk(commit_log.max_offset)
        self._commit_log_flush.appended(commit_log.max_offset)
        return commit_log.max_offset

    def replication_chunk(self, from_offset: int, max_bytes: int) -> tuple[int, memoryview] | None:
        """A master: the next whole records to send a slave from `from_offset` (see
        `CommitLog.replication_chunk`)."""
        return self._commit_log.replication_chunk(from_offset, max_bytes)

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

