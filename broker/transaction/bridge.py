"""`TransactionBridge`: transactional messages in the store (RocketMQ `TransactionalMessageBridge`
and `EndTransactionProcessor`'s store side). Half messages go to RMQ_SYS_TRANS_HALF_TOPIC queue 0
with their real topic and queue in REAL_TOPIC / REAL_QID; a resolution (commit, rollback, drop) is
an op record tagged "d" in RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0 whose body is the half's queue
offset; a check-back an op record tagged "c". Both topics are in the commit log, so a restart (or a
kill -9) rebuilds the `TransactionTable` from them (`rebuild`).

Where we differ from RocketMQ, and why:
- A check-back does not re-append the half message (RocketMQ's `putBackHalfMsgQueue`, which gives
  it a new offset and the new TRANSACTION_CHECK_TIMES): it writes a "c" op record. The half keeps
  one identity, so a commit is accepted once only, whichever check or send it answers; a second
  commit (a duplicate, a late answer to an earlier check) is refused and delivers nothing.
- END_TRANSACTION for an unknown or already resolved half is an error (SYSTEM_ERROR naming which),
  where RocketMQ would write the real message again.
- The timeout counts from the half's store time (the broker's clock), not the producer's born time.

Speed (issue #38): a commit does not read its half back from the commit log while the half is in
a bounded cache (`HALF_CACHE_LIMIT` entries, oldest evicted first: a half evicted, or pending
across a restart, is read back as before); and the "d" op records of the resolutions made in one
event-loop step are written as one op record naming them all (RocketMQ 5's
`TransactionalOpBatchService` batches them the same way, over `transactionOpBatchInterval`), after
that step's committed messages, so an op record is never in the log before the real message it
resolves. A kill -9 between the two leaves the half pending after the restart: its check-back
decides it again (at least once, as a power loss before the fsync already could).

Batches (issue #38, ours): `prepare_batch` stores the halves of a transactional SEND_BATCH_MESSAGE
as one append; END_TRANSACTION_BATCH (`processor.EndTransactionBatchProcessor`) checks each entry
with `validate`, writes the commits of one queue with `commit_run` (one append) and the batch's op
record with `flush_ops` before answering."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from broker.store.message_store import MessageStore
from broker.store.record import RecordError, decode_stored_fields
from broker.store.results import PutMessageResult, PutMessageStatus
from broker.topics.topic_config_manager import TopicConfigManager
from broker.trace.recorder import TraceRecorder
from broker.transaction.state import HalfState, TransactionTable
from protocol.errors import ServiceNotAvailable, SystemError_
from protocol.headers_v5 import EndTransactionRequestHeader
from protocol.message import (
    F_BODY,
    F_FLAG,
    F_PROPERTIES,
    F_STORE_TIMESTAMP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    encode_stored_message,
    stored_origin,
)
from protocol.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from protocol.transaction import (
    OP_TAG_CHECKED,
    OP_TAG_REMOVED,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    decode_op_body,
    encode_op_body,
)

log = logging.getLogger(__name__)
_UNITS_PER_READ = 4096
HALF_CACHE_LIMIT = 16_384       # pending halves kept in memory for their commit (~ 200 B + body each)
MessagesIn = Callable[[str, int, int], None]
# a cached half: (commit_log_offset, properties, flag, body, (born_timestamp, born_host, reconsume_times))
CachedHalf = tuple[int, dict[str, str], int, bytes, tuple[int, str, int]]


class TransactionBridge:
    def __init__(self, store: MessageStore, topics: TopicConfigManager, table: TransactionTable, store_host: str,
                 now_ms: Callable[[], int], on_stored: MessagesIn) -> None:
        self._store, self._topics, self.table = store, topics, table
        self._store_host, self._now_ms, self._on_stored = store_host, now_ms, on_stored
        self._cache: dict[int, CachedHalf] = {}
        self._removed: list[int] = []       # resolved halves whose "d" op record is still to write
        self.trace: TraceRecorder | None = None     # the message trace (check-backs, outcomes); None: off

    # -- start-up --------------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Rebuild the table from the half and op queues as the store recovered them (RocketMQ
        rebuilds the same from its op-queue scan, per check pass): every retained half, then every
        op, then the store time of each half still pending."""
        store = self._store
        half_min = store.get_min_offset(TRANS_HALF_TOPIC, 0)
        self.table = table = TransactionTable(base=half_min)
        for half_offset, (commit_log_offset, _, _) in self._units(TRANS_HALF_TOPIC, half_min):
            table.add_half(half_offset, commit_log_offset, 0)
        for _, (commit_log_offset, size, _) in self._units(TRANS_OP_HALF_TOPIC,
                                                          store.get_min_offset(TRANS_OP_HALF_TOPIC, 0)):
            payload = store.read_payload(commit_log_offset, size)
            try:
                if payload is None:
                    raise RecordError("gone")
                fields = decode_stored_fields(payload)
            except RecordError:
                continue
            tag = fields[F_PROPERTIES].get(PROPERTY_TAGS)
            for half_offset in decode_op_body(bytes(fields[F_BODY])):
                if tag == OP_TAG_REMOVED:
                    table.remove(half_offset)
                elif tag == OP_TAG_CHECKED:
                    table.checked(half_offset)
        for half in table.pending.values():
            half_fields = store.look_message_fields(half.commit_log_offset)
            half.stored_at_ms = int(half_fields[F_STORE_TIMESTAMP]) if half_fields is not None else 0
        if table.pending_count:
            log.info("transactions: %d half messages pending after start-up", table.pending_count)

    def _units(self, topic: str, queue_offset: int) -> Any:
        store = self._store
        end = store.get_max_offset(topic, 0)
        while queue_offset < end:
            units = store.read_queue_units(topic, 0, queue_offset, _UNITS_PER_READ)
            if not units:
                queue_offset += 1       # a hole (a file being removed): step over it
                continue
            for unit in units:
                yield queue_offset, unit
                queue_offset += 1

    # -- half messages ---------------------------------------------------------------------------

    def prepare(self, *, topic: str, queue_id: int, body: bytes, properties: dict[str, str], flag: int,
                born_timestamp: int, born_host: str, reconsume_times: int) -> PutMessageResult:
        """Store a half message (RocketMQ `parseHalfMessageInner`): in the half topic, queue 0,
        with REAL_TOPIC / REAL_QID; pending in the table from now on. The send processor has
        checked it (`put_checked_message`'s terms: body within `max_message_bytes`, no DELAY)."""
        half_properties = {**properties, PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: str(queue_id)}
        result = self._store.put_checked_message(topic=TRANS_HALF_TOPIC, queue_id=0, body=body,
                                                 properties=half_properties, flag=flag, born_timestamp=born_timestamp,
                                                 born_host=born_host, reconsume_times=reconsume_times)
        if result.ok:
            self._remember(result.queue_offset, result.commit_log_offsets[0], half_properties, flag, body,
                           (born_timestamp, born_host, reconsume_times), self._now_ms())
        return result

    def prepare_batch(self, *, topic: str, queue_id: int, messages: list[tuple[dict[str, str], int, bytes]],
                      producer_group: str, born_timestamp: int, born_host: str) -> PutMessageResult:
        """`prepare` of many half messages (a SEND_BATCH_MESSAGE whose messages are all TRAN_MSG):
        one append to the half queue, consecutive half offsets from the result's
        `queue_offset`, each message pending and cached as `prepare`'s, its PGROUP
        `producer_group`. Checked as `prepare`'s (`put_checked_messages`'s terms)."""
        extra = {PROPERTY_PRODUCER_GROUP: producer_group, PROPERTY_REAL_TOPIC: topic,
                 PROPERTY_REAL_QUEUE_ID: str(queue_id)}
        halves = [({**properties, **extra}, flag, body) for properties, flag, body in messages]
        result = self._store.put_checked_messages(topic=TRANS_HALF_TOPIC, queue_id=0, messages=halves,
                                                  born_timestamp=born_timestamp, born_host=born_host)
        if result.ok:       # `_remember` of each, inline (~0.4 µs less a half)
            now_ms, origin, half_offset = self._now_ms(), (born_timestamp, born_host, 0), result.queue_offset
            add_half, cache = self.table.add_half, self._cache
            for commit_log_offset, (properties, flag, body) in zip(result.commit_log_offsets, halves, strict=True):
                add_half(half_offset, commit_log_offset, now_ms)
                if len(cache) >= HALF_CACHE_LIMIT:
                    del cache[next(iter(cache))]
                cache[half_offset] = (commit_log_offset, properties, flag, body, origin)
                half_offset += 1
        return result

    def _remember(self, half_offset: int, commit_log_offset: int, properties: dict[str, str], flag: int,
                  body: bytes, origin: tuple[int, str, int], now_ms: int) -> None:
        """A stored half: pending in the table, and cached for its commit (oldest evicted first)."""
        self.table.add_half(half_offset, commit_log_offset, now_ms)
        cache = self._cache
        if len(cache) >= HALF_CACHE_LIMIT:
            del cache[next(iter(cache))]
        cache[half_offset] = (commit_log_offset, properties, flag, body, origin)

    def half_message(self, commit_log_offset: int) -> list[Any] | None:
        """The stored fields of the half at `commit_log_offset`, None when there is none there."""
        fields = self._store.look_message_fields(commit_log_offset)
        if fields is None or fields[0] != TRANS_HALF_TOPIC:
            return None
        return fields

    def check_body(self, half_offset: int, fields: list[Any], checks: int) -> bytes:
        """The CHECK_TRANSACTION_STATE body: the half as a stored array with its real topic and
        queue (RocketMQ restores them the same way), TRANSACTION_CHECK_TIMES = `checks`."""
        properties = dict(fields[F_PROPERTIES])
        topic = properties.get(PROPERTY_REAL_TOPIC, "")
        queue_id = int(properties.get(PROPERTY_REAL_QUEUE_ID, "0") or 0)
        properties[PROPERTY_TRANSACTION_CHECK_TIMES] = str(checks)
        born_timestamp, born_host, reconsume_times, sys_flag = stored_origin(fields)
        return encode_stored_message(
            topic=topic, queue_id=queue_id, queue_offset=half_offset, commit_log_offset=fields[3], flag=fields[F_FLAG],
            sys_flag=sys_flag, born_timestamp=born_timestamp, born_host=born_host,
            store_timestamp=fields[F_STORE_TIMESTAMP], store_host=fields[9], reconsume_times=reconsume_times,
            properties=properties, body=fields[F_BODY])

    # -- resolution ------------------------------------------------------------------------------

    def end(self, header: EndTransactionRequestHeader) -> int:
        """END_TRANSACTION: commit (the real message written to its topic and queue, sys_flag
        COMMIT; its "d" op record follows at the end of this loop step, see `flush_ops`) or roll
        back (the op record only); unknown (0): nothing. Returns the commit-log end of the
        committed message (0: none written). Raises `SystemError_` naming
        why for a half that is unknown, already resolved, of another group or another topic, or an
        offset pair that does not match, and for any other `commit_or_rollback`; nothing changes
        then. The table forgets the half before this returns, so a second END_TRANSACTION for it,
        even one read in the same loop step, is refused."""
        return self.resolve(header.producer_group, header.topic, header.tran_state_table_offset,
                            header.commit_log_offset, header.commit_or_rollback)

    def resolve(self, producer_group: str, topic: str, half_offset: int, commit_log_offset: int, action: int) -> int:
        """`end` with the header's fields (`producer_group`, `topic`, `tran_state_table_offset`,
        `commit_log_offset`, `commit_or_rollback`) as they are."""
        _, properties, flag, body, origin = self.validate(producer_group, topic, half_offset, commit_log_offset, action)
        if action == TRANSACTION_NOT_TYPE:
            return 0
        if action == TRANSACTION_COMMIT_TYPE:
            end_offset = self._commit(half_offset, properties, flag, body, origin)
        else:
            end_offset = 0
            if self.trace is not None:
                self.trace.transaction(half_offset, "rolled_back", None)
        self._resolve_later(half_offset)
        return end_offset

    def validate(self, producer_group: str, topic: str, half_offset: int, commit_log_offset: int,
                 action: int) -> CachedHalf:
        """The pending half an END_TRANSACTION names, changing nothing; raises `SystemError_` as
        `end` does."""
        if action not in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_NOT_TYPE):
            raise SystemError_(f"commit_or_rollback must be 8 (commit), 12 (rollback) or 0 (unknown), got {action}")
        half = self.table.pending.get(half_offset)
        if half is None:        # (a pending half is neither: its state is only looked up when none)
            if self.table.state(half_offset) is HalfState.RESOLVED:
                raise SystemError_(f"the half message at transaction offset {half_offset} was already committed, "
                                   f"rolled back or dropped: nothing changed")
            raise SystemError_(f"no half message at transaction offset {half_offset}: nothing changed")
        if half.commit_log_offset != commit_log_offset:
            raise SystemError_(f"the half message at transaction offset {half_offset} is at commit log offset "
                               f"{half.commit_log_offset}, not {commit_log_offset}: nothing changed")
        cached = self._cache.get(half_offset)
        if cached is None or cached[0] != half.commit_log_offset:
            cached = self._read_back(half.commit_log_offset)
        properties = cached[1]
        if properties.get(PROPERTY_PRODUCER_GROUP) != producer_group:
            raise SystemError_(f"the half message at transaction offset {half_offset} belongs to producer group "
                               f"{properties.get(PROPERTY_PRODUCER_GROUP)!r}, not {producer_group!r}")
        if properties.get(PROPERTY_REAL_TOPIC) != topic:
            raise SystemError_(f"the half message at transaction offset {half_offset} is for topic "
                               f"{properties.get(PROPERTY_REAL_TOPIC)!r}, not {topic!r}")
        return cached

    def _read_back(self, commit_log_offset: int) -> CachedHalf:
        fields = self.half_message(commit_log_offset)
        if fields is None:
            raise SystemError_(f"the half message at commit log offset {commit_log_offset} is no longer "
                               f"stored: nothing changed")
        born_timestamp, born_host, reconsume_times, _ = stored_origin(fields)
        return commit_log_offset, fields[F_PROPERTIES], fields[F_FLAG], fields[F_BODY], (born_timestamp, born_host,
                                                                                         reconsume_times)

    def _commit(self, half_offset: int, half_properties: dict[str, str], flag: int, body: bytes,
                origin: tuple[int, str, int]) -> int:
        topic, queue_id, properties = self.real_message(half_properties)
        born_timestamp, born_host, reconsume_times = origin
        # checked at its send (topic name, size, no DELAY) and its queue just now: the checked one-message put
        result = self._store.put_checked_message(topic=topic, queue_id=queue_id, body=body, properties=properties,
                                                 flag=flag, born_timestamp=born_timestamp, born_host=born_host,
                                                 reconsume_times=reconsume_times, sys_flag=TRANSACTION_COMMIT_TYPE)
        _check(result, "the committed message")
        self._on_stored(topic, 1, len(body))
        if self.trace is not None:
            self.trace.transaction(half_offset, "committed", [topic, queue_id, result.queue_offset])
        return result.end_offset

    def real_message(self, half_properties: dict[str, str],
                     checked: set[tuple[str, int]] | None = None) -> tuple[str, int, dict[str, str]]:
        """(topic, queue_id, properties) of the message a commit writes; raises what
        `TopicConfigManager.for_send` raises when that topic is gone or read-only. `checked`:
        (topic, queue_id) pairs already checked in this loop step (skipped; the pair is added)."""
        properties = dict(half_properties)
        topic = properties.pop(PROPERTY_REAL_TOPIC)
        queue_id = int(properties.pop(PROPERTY_REAL_QUEUE_ID))
        properties.pop(PROPERTY_TRANSACTION_CHECK_TIMES, None)
        if checked is None or (topic, queue_id) not in checked:
            self._topics.for_send(topic, queue_id)
            if checked is not None:
                checked.add((topic, queue_id))
        return topic, queue_id, properties

    def commit_run(self, topic: str, queue_id: int, origin: tuple[int, str, int],
                   run: list[tuple[int, dict[str, str], int, bytes]]) -> int:
        """Commit validated halves (`validate`, then `real_message`) whose real messages go to one
        queue and share one origin (born_timestamp, born_host, reconsume_times: the halves of one
        batch do): `run` items are (half_offset, real properties, flag, body); the messages
        written as one append with sys_flag COMMIT, then the halves resolved as `end` resolves
        them. Returns the commit-log end; raises `ServiceNotAvailable` when the store refuses
        (nothing changed then)."""
        born_timestamp, born_host, reconsume_times = origin
        result = self._store.put_checked_messages(
            topic=topic, queue_id=queue_id, messages=[(properties, flag, body) for _, properties, flag, body in run],
            born_timestamp=born_timestamp, born_host=born_host, reconsume_times=reconsume_times,
            sys_flag=TRANSACTION_COMMIT_TYPE)
        _check(result, "the committed messages")
        self._on_stored(topic, len(run), sum(len(item[3]) for item in run))
        half_offsets = [item[0] for item in run]
        if self.trace is not None:
            self.trace.committed_run(half_offsets, topic, queue_id, result.queue_offset)
        self._resolve_run(half_offsets)
        return result.end_offset

    def roll_back(self, half_offset: int) -> None:
        """Roll back a validated half (`validate`): resolved as `end` resolves it."""
        if self.trace is not None:
            self.trace.transaction(half_offset, "rolled_back", None)
        self._resolve_later(half_offset)

    def _resolve_later(self, half_offset: int) -> None:
        """Resolve `half_offset` in the table now and write its "d" op record with the others of
        this loop step (`flush_ops`), or at once when no event loop runs."""
        self.table.remove(half_offset)
        self._cache.pop(half_offset, None)
        removed = self._removed
        removed.append(half_offset)
        if len(removed) > 1:
            return
        try:
            asyncio.get_running_loop().call_soon(self.flush_ops)
        except RuntimeError:
            self.flush_ops()

    def _resolve_run(self, half_offsets: list[int]) -> None:
        """`_resolve_later` of each of `half_offsets`, in order."""
        remove, drop, removed = self.table.remove, self._cache.pop, self._removed
        schedule = not removed
        for half_offset in half_offsets:
            remove(half_offset)
            drop(half_offset, None)
        removed += half_offsets
        if not schedule or not removed:
            return
        try:
            asyncio.get_running_loop().call_soon(self.flush_ops)
        except RuntimeError:
            self.flush_ops()

    def flush_ops(self) -> None:
        """Write the one "d" op record of the halves resolved since the last call (nothing when
        none). A refused write is logged: those halves are pending again after a restart, and
        their check-backs decide them again."""
        removed, self._removed = self._removed, []
        if not removed:
            return
        result = self._put_op(removed, OP_TAG_REMOVED)
        if not result.ok:
            log.warning("the op record of %d resolved half messages could not be stored: %s %s; they are "
                        "checked back after a restart", len(removed), result.status.name, result.remark)

    def remove(self, half_offset: int) -> int:
        """Resolve `half_offset`: the op record "d" written and the table told; returns its end."""
        self.flush_ops()
        result = self._put_op([half_offset], OP_TAG_REMOVED)
        self.table.remove(half_offset)
        self._cache.pop(half_offset, None)
        _check(result, "the op record")
        return result.end_offset

    def record_check(self, half_offset: int) -> int:
        """One check-back of `half_offset`: the op record "c" written and the table told."""
        result = self._put_op([half_offset], OP_TAG_CHECKED)
        if result.ok:
            self.table.checked(half_offset)
            half = self.table.pending.get(half_offset)
            if self.trace is not None and half is not None:
                self.trace.transaction(half_offset, "checked_back", half.checks)
        return result.end_offset

    def drop(self, half_offset: int, fields: list[Any]) -> None:
        """After the last check-back: a copy in TRANS_CHECK_MAX_TIME_TOPIC (as RocketMQ, for an
        operator to look at) and the half resolved."""
        origin = stored_origin(fields)
        half = self.table.pending.get(half_offset)
        if self.trace is not None:
            self.trace.transaction(half_offset, "half_dropped", half.checks if half is not None else 0)
        self._store.put_scheduled(topic=TRANS_CHECK_MAX_TIME_TOPIC, queue_id=0,
                                  messages=[(dict(fields[F_PROPERTIES]), fields[F_FLAG], fields[F_BODY])],
                                  origins=[origin])
        self.remove(half_offset)

    def _put_op(self, half_offsets: list[int], tag: str) -> PutMessageResult:
        return self._store.put_message(topic=TRANS_OP_HALF_TOPIC, queue_id=0, body=encode_op_body(half_offsets),
                                       properties={PROPERTY_TAGS: tag}, flag=0, born_timestamp=self._now_ms(),
                                       born_host=self._store_host)


def _check(result: PutMessageResult, what: str) -> None:
    if result.status is not PutMessageStatus.PUT_OK:
        raise ServiceNotAvailable(f"{what} could not be stored: {result.status.name} {result.remark}".rstrip())
