"""ReputService: builds consume queues from the commit log, then tells the arrival listener
(RocketMQ `ReputMessageService`, REFERENCE.md §4.4 and §3 "Arrival source").

Two sources, in commit-log order:
- records in [reput_from_offset, handoff_from) are read back from disk (`CommitLog.read_back`:
  `_records.read_stored` in C when built): the backlog found at start-up by recovery, and every
  transfer a slave copies from its master; the service dispatches them `DISK_SLICE_RECORDS` at a
  time and lets the event loop run between slices;
- everything appended since start arrives as `DispatchEntry` tuples handed over by the store's put
  path (`hand_off`), so the hot path decodes nothing again.
Woken by every hand-off (no polling); on stop it drains everything handed over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from broker.schedule.delay_levels import deliver_at_ms
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from broker.store.key_index import KeyIndex
from broker.store.record import RecordError, StoredEntry, decode_stored_fields, stored_entry
from broker.timer.deliver_time import timer_due_of
from protocol.message import (
    PROPERTY_TAGS,
)
from protocol.service import Service
from protocol.topics import SCHEDULE_TOPIC, TIMER_TOPIC

log = logging.getLogger(__name__)

DispatchEntry = tuple[str, int, int, int, int, int, int, dict[str, str]]
"""(topic, queue_id, queue_offset, commit_log_offset, size, tags_code, store_timestamp, properties)."""

ArrivalListener = Callable[[str, int, int, int, dict[str, str]], None]
"""`on_message_arriving(topic, queue_id, max_offset, tags_code, properties)`; max_offset is the
message's queue_offset + 1 (the queue's new max)."""

RunListener = Callable[[str, int, int, list[tuple[int, int, int]], list[dict[str, str]]], None]
"""`on_run_arriving(topic, queue_id, queue_offset, units, properties)`: a batch's messages, all of one
queue from `queue_offset` on, are in their consume queue; `units[i]` is message i's
(commit_log_offset, size, tags_code). Called once for the run instead of the `ArrivalListener` once
per message, so the listener can see at once that nobody waits there (the usual case)."""

TagsCode = Callable[[str | None], int]

_TAG_CODES_MAX = 4_096
DISK_SLICE_RECORDS = 256      # records read back from disk per event-loop step of the service


class ReputService(Service):
    """`reput_from_offset`: every record before it is in its consume queue. `lag_bytes` is how far
    behind the commit log's write position that is."""

    name = "reput"
    idle_interval_ms = 60_000   # a safety net only: every append wakes the service

    def __init__(self, commit_log: CommitLog, consume_queues: ConsumeQueueTable, tags_code: TagsCode,
                 delay_levels: tuple[int, ...] = ()) -> None:
        super().__init__()
        self._commit_log, self._consume_queues, self._tags_code = commit_log, consume_queues, tags_code
        self._delay_levels = delay_levels
        self._tag_codes: dict[str | None, int] = {}
        self.reput_from_offset = 0
        self._handoff_from = 0
        self._pending: list[DispatchEntry] = []
        self.listener: ArrivalListener | None = None
        self.run_listener: RunListener | None = None    # else `listener` per message of a run
        self.key_index: KeyIndex | None = None          # filled as messages are dispatched

    def begin(self, reput_from_offset: int, handoff_from: int) -> None:
        """Set the recovered start; records in [reput_from_offset, handoff_from) come from disk,
        later ones only through `hand_off`."""
        self.reput_from_offset, self._handoff_from = reput_from_offset, handoff_from
        self._pending = []

    def extend_from_disk(self, end_offset: int) -> None:
        """Records up to `end_offset` were written by something other than the put path (a slave's
        replicated bytes): dispatch them from disk on the service's next pass."""
        self._handoff_from = max(self._handoff_from, end_offset)
        self.wakeup()

    def abandon(self) -> None:
        """Forget what was handed over but not dispatched (a crash-style stop: recovery re-reads it
        from the commit log)."""
        self._pending = []

    @property
    def lag_bytes(self) -> int:
        return self._commit_log.max_offset - self.reput_from_offset

    def hand_off(self, entries: list[DispatchEntry]) -> None:
        """Take freshly appended records (in commit-log order) and dispatch them now, in the same
        event-loop step as the append, so a held pull is woken before the send is even
        acknowledged; while the start-up backlog is still being read from disk (or after a failed
        dispatch) they wait for the service's next pass instead."""
        self._pending.extend(entries)
        if self.reput_from_offset >= self._handoff_from:
            self._dispatch_logged()
        if self._pending or self.reput_from_offset < self._handoff_from:
            self.wakeup()

    def hand_off_one(self, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int, size: int,
                     tags_code: int, stored_at_ms: int, properties: dict[str, str]) -> None:
        """`hand_off` of one record (the one-message send path), dispatched inline when nothing is
        waiting before it: the same steps as `_dispatch_pending` without building a batch."""
        if self._pending or self.reput_from_offset < self._handoff_from:
            self.hand_off([(topic, queue_id, queue_offset, commit_log_offset, size, tags_code, stored_at_ms,
                            properties)])
            return
        try:
            queue = self._consume_queues.queues.get((topic, queue_id)) or self._consume_queues.get_or_create(
                topic, queue_id)
            appended = queue.append(commit_log_offset, size, tags_code, queue_offset)
        except Exception:      # as `_dispatch_logged`: keep it for the next pass
            log.exception("reput: dispatch failed at %d; will retry", commit_log_offset)
            self.hand_off([(topic, queue_id, queue_offset, commit_log_offset, size, tags_code, stored_at_ms,
                            properties)])
            return
        self.reput_from_offset = max(self.reput_from_offset, commit_log_offset + size)
        if not appended:
            return
        if self.key_index is not None:
            self.key_index.add(topic, properties, commit_log_offset, stored_at_ms)
        if self.listener is not None:
            try:                # (`_notify`, inline: once per single send)
                self.listener(topic, queue_id, queue_offset + 1, tags_code, properties)
            except Exception:
                log.exception("reput: arrival listener failed for %s:%d", topic, queue_id)

    def hand_off_run(self, topic: str, queue_id: int, queue_offset: int, units: list[tuple[int, int, int]],
                     stored_at_ms: int, properties: list[dict[str, str]]) -> None:
        """`hand_off` of a batch's records, all of one queue with consecutive queue offsets from
        `queue_offset`; `units[i]` is message i's (commit_log_offset, size, tags_code). Dispatched
        inline as one run (one consume-queue write) when nothing is waiting before it."""
        queue = None
        if not self._pending and self.reput_from_offset >= self._handoff_from:
            queue = self._consume_queues.queues.get((topic, queue_id))
        if queue is None or not queue.append_run(queue_offset, units):
            # waiting entries go first, a new queue or file is made, or a run crosses files:
            # the general path, entry by entry (and retried on the next pass after an error)
            self.hand_off([(topic, queue_id, queue_offset + i, clo, size, code, stored_at_ms, properties[i])
                           for i, (clo, size, code) in enumerate(units)])
            return
        last_offset, last_size, _ = units[-1]
        self.reput_from_offset = max(self.reput_from_offset, last_offset + last_size)
        key_index, listener = self.key_index, self.listener
        if key_index is not None:
            key_index.add_run(topic, properties, units, stored_at_ms)
        if self.run_listener is not None:
            try:
                self.run_listener(topic, queue_id, queue_offset, units, properties)
            except Exception:
                log.exception("reput: arrival listener failed for %s:%d", topic, queue_id)
        elif listener is not None:
            max_offset = queue_offset
            for (_, _, code), props in zip(units, properties, strict=True):
                max_offset += 1
                _notify(listener, topic, queue_id, max_offset, code, props)

    async def run(self) -> None:
        while await self.wait(self.idle_interval_ms):
            while self._dispatch_logged(DISK_SLICE_RECORDS):   # more read back from disk: let the loop run
                await asyncio.sleep(0)
        self._dispatch_logged()

    def _dispatch_logged(self, max_from_disk: int | None = None) -> bool:
        """`dispatch_available`; True when records read back from disk are left (`max_from_disk`)."""
        try:
            self.dispatch_available(max_from_disk=max_from_disk)
        except Exception:      # e.g. OSError creating a file: keep the rest and retry on the next wake
            log.exception("reput: dispatch failed at %d; will retry", self.reput_from_offset)
            return False
        return self.reput_from_offset < self._handoff_from

    def dispatch_available(self, *, notify: bool = True, max_from_disk: int | None = None) -> int:
        """Dispatch everything available now (synchronously); returns how many records. The
        listener is called unless `notify` is False (start-up re-dispatch). An error from the
        listener is logged and does not stop dispatch; any other error propagates and what was not
        dispatched is kept for the next call. With `max_from_disk`, about that many records are
        read back from disk (whole `read_back` lists) and the rest, and what was handed over after
        them, wait for the next call: the service's pass over a slave's copied bytes yields to the
        event loop between slices, so the slave's fsync and acknowledgement are not held behind
        the dispatch of a large transfer (they were: a SYNC_MASTER's batched sends waited on it)."""
        listener = self.listener if notify else None
        count = 0
        if self.reput_from_offset < self._handoff_from:
            count += self._dispatch_from_disk(self._handoff_from, listener, max_from_disk)
            if self.reput_from_offset < self._handoff_from:
                return count
            self._handoff_from = self.reput_from_offset
        if self._pending:
            count += self._dispatch_pending(listener)
        return count

    def _dispatch_pending(self, listener: ArrivalListener | None) -> int:
        pending, self._pending = self._pending, []
        consume_queues = self._consume_queues
        last_key: tuple[str, int] | None = None
        queue: ConsumeQueue | None = None
        done = 0
        try:
            key_index = self.key_index
            for topic, queue_id, queue_offset, commit_log_offset, size, tags_code, stored_at, properties in pending:
                if last_key != (topic, queue_id):
                    queue = consume_queues.get_or_create(topic, queue_id)
                    last_key = (topic, queue_id)
                assert queue is not None
                appended = queue.append(commit_log_offset, size, tags_code, queue_offset)
                if appended and key_index is not None:
                    key_index.add(topic, properties, commit_log_offset, stored_at)
                if appended and listener is not None:
                    try:
                        listener(topic, queue_id, queue_offset + 1, tags_code, properties)
                    except Exception:
                        log.exception("reput: arrival listener failed for %s:%d", topic, queue_id)
                done += 1
        finally:
            if done:
                last = pending[done - 1]
                self.reput_from_offset = max(self.reput_from_offset, last[3] + last[4])
            if done < len(pending):
                self._pending[:0] = pending[done:]
        return done

    def _dispatch_from_disk(self, to_offset: int, listener: ArrivalListener | None,
                            max_records: int | None = None) -> int:
        """Decode and dispatch the records in [reput_from_offset, to_offset). Consecutive records of
        one queue with one store time (a batch, as a slave copies it from its master) go into the
        consume queue, the key index and the listener as one run, as `hand_off_run` does."""
        count = 0
        run = _Run("", -1, -1, -1)
        codes = self._tag_codes
        for item in self._commit_log.read_back(self.reput_from_offset, to_offset):
            if type(item) is list:
                entries = item
            else:
                record = cast(tuple[int, int, memoryview], item)
                decoded = self._decoded(record)
                if decoded is None:     # undecodable: logged and passed
                    self._dispatch_run(run, listener)
                    run = _Run("", -1, -1, -1)
                    self.reput_from_offset = record[0] + record[1]
                    count += 1
                    continue
                entries = decoded
            units, properties = run.units, run.properties
            for commit_log_offset, size, topic, queue_id, queue_offset, stored_at, props in entries:
                if queue_offset != run.next_queue_offset or topic != run.topic or queue_id != run.queue_id \
                        or stored_at != run.stored_at:
                    self._dispatch_run(run, listener)
                    run = _Run(topic, queue_id, queue_offset, stored_at)
                    units, properties = run.units, run.properties
                try:
                    if run.special:
                        if topic == SCHEDULE_TOPIC:     # the unit holds the due time (REFERENCE.md §10)
                            tags_code = deliver_at_ms(stored_at, queue_id + 1, self._delay_levels)
                        else:                           # and the timer message's (TIMER_OUT_MS)
                            tags_code = timer_due_of(props)
                    else:
                        tag = props.get(PROPERTY_TAGS)
                        known = codes.get(tag)
                        tags_code = known if known is not None else self._tags_code_of(tag)
                except (ValueError, TypeError, AttributeError) as exc:
                    self._dispatch_run(run, listener)
                    run = _Run("", -1, -1, -1)
                    units, properties = run.units, run.properties
                    log.error("reput: skipping undecodable record at %d: %s", commit_log_offset, exc)
                    self.reput_from_offset = commit_log_offset + size
                    count += 1
                    continue
                units.append((commit_log_offset, size, tags_code))
                properties.append(props)
                run.next_queue_offset += 1
                count += 1
            if max_records is not None and count >= max_records:      # the rest on the next call
                self._dispatch_run(run, listener)
                return count
        self._dispatch_run(run, listener)
        # past a zero tail at the end (or a damaged record, logged by `records`)
        self.reput_from_offset = max(self.reput_from_offset, to_offset)
        return count

    @staticmethod
    def _decoded(record: tuple[int, int, memoryview]) -> list[StoredEntry] | None:
        """The `StoredEntry` of a record `read_stored` left (not of the usual types); None (logged)
        when it is no stored message."""
        commit_log_offset, size, payload = record
        try:
            fields = decode_stored_fields(payload)
        except (RecordError, TypeError) as exc:
            log.error("reput: skipping undecodable record at %d: %s", commit_log_offset, exc)
            return None
        return [stored_entry(commit_log_offset, size, fields)]

    def _tags_code_of(self, tag: str | None) -> int:
        """`tags_code(tag)`, remembered (a topic's few tags recur: its Python loop per message was
        7 % of a slave's reput); forgotten all at once past `_TAG_CODES_MAX` tags."""
        code = self._tags_code(tag)
        if len(self._tag_codes) >= _TAG_CODES_MAX:
            self._tag_codes.clear()
        self._tag_codes[tag] = code
        return code

    def _dispatch_run(self, run: _Run, listener: ArrivalListener | None) -> None:
        """One queue's consecutive records read back from disk: into the consume queue in one write
        when they follow its end in one file, else one by one; then the key index and the
        listener. An `OSError` (a full disk) propagates with `reput_from_offset` at the run's start
        (or at the record that failed), so the next call goes on from there."""
        units, properties = run.units, run.properties
        if not units:
            return
        topic, queue_id, first_queue_offset, stored_at = run.topic, run.queue_id, run.first_queue_offset, run.stored_at
        queue = self._consume_queues.get_or_create(topic, queue_id)
        if len(units) > 1 and queue.append_run(first_queue_offset, units):
            last_offset, last_size, _ = units[-1]
            self.reput_from_offset = last_offset + last_size
            if self.key_index is not None:
                self.key_index.add_run(topic, properties, units, stored_at)
            if listener is None:
                return
            if self.run_listener is not None and listener is self.listener:
                try:
                    self.run_listener(topic, queue_id, first_queue_offset, units, properties)
                except Exception:
                    log.exception("reput: arrival listener failed for %s:%d", topic, queue_id)
                return
            for index, (_, _, code) in enumerate(units):
                _notify(listener, topic, queue_id, first_queue_offset + index + 1, code, properties[index])
            return
        for index, (commit_log_offset, size, code) in enumerate(units):
            props = properties[index]
            appended = queue.append(commit_log_offset, size, code, first_queue_offset + index)
            if self.key_index is not None:
                self.key_index.add(topic, props, commit_log_offset, stored_at)
            if appended and listener is not None:
                _notify(listener, topic, queue_id, first_queue_offset + index + 1, code, props)
            self.reput_from_offset = commit_log_offset + size


class _Run:
    """Consecutive records read back from disk that go into one queue at one store time: their
    units (commit_log_offset, size, tags_code) and properties, and the queue offset the next record
    must have to join them. `special`: a topic whose unit holds a due time, not a tag's code."""

    __slots__ = ("first_queue_offset", "next_queue_offset", "properties", "queue_id", "special", "stored_at",
                 "topic", "units")

    def __init__(self, topic: str, queue_id: int, first_queue_offset: int, stored_at: int) -> None:
        self.topic, self.queue_id, self.stored_at = topic, queue_id, stored_at
        self.first_queue_offset = self.next_queue_offset = first_queue_offset
        self.special = topic in (SCHEDULE_TOPIC, TIMER_TOPIC)
        self.units: list[tuple[int, int, int]] = []
        self.properties: list[dict[str, str]] = []


def _notify(listener: ArrivalListener, topic: str, queue_id: int, max_offset: int, tags_code: int,
            properties: dict[str, str]) -> None:
    try:
        listener(topic, queue_id, max_offset, tags_code, properties)
    except Exception:
        log.exception("reput: arrival listener failed for %s:%d", topic, queue_id)
