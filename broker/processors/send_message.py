"""SEND_MESSAGE and SEND_BATCH_MESSAGE → `MessageStore.put_message(s)`.

In SYNC_FLUSH (the default) the response is written after an fsync that covers the record
(group commit); a flush slower than `sync_flush_timeout_ms` is answered FLUSH_DISK_TIMEOUT. A send
to a topic whose config is not on disk yet (auto-created by this send, or just created or changed)
is stored and answered once it is (`answer_put`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker.persist import Durable
from broker.processors.batch_body import MAX_BATCH_MESSAGES as MAX_BATCH_MESSAGES
from broker.processors.batch_body import BatchItems as BatchItems
from broker.processors.batch_body import _read_batch_body as _read_batch_body  # its C twin, for tests
from broker.processors.batch_body import decode_batch as decode_batch
from broker.processors.batch_body import decode_batch_py as decode_batch_py
from broker.processors.batch_body import half_batch
from broker.processors.dedup_sends import DedupSends
from broker.processors.usual_send import send_response, send_response_py, usual_send
from broker.processors.validate import check_message_size, require_group_name, require_topic_name
from broker.remoting.context import RequestContext
from broker.remoting.dispatcher import Deferred
from broker.store.message_store import MessageStore
from broker.store.results import PutMessageResult, PutMessageStatus
from broker.timer.timer_send import TimerSends
from broker.topics.retry_topics import RetryTopics
from broker.topics.system_topics import require_sendable
from broker.topics.topic_config_manager import TopicConfigManager
from broker.trace.recorder import TraceRecorder
from broker.transaction.bridge import TransactionBridge
from protocol.codes import FLAG_RESPONSE, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import MessageIllegal, NoPermission, ServiceNotAvailable, SystemError_
from protocol.headers import (
    INT64_MAX,
    SendBatchMessageRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from protocol.message import (
    MAX_PROPERTIES_BYTES,
    PROPERTY_DELAY_TIME_LEVEL,
    make_msg_id,
    msg_id_prefix,
    offset_msg_ids,
)
from protocol.transaction import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED

MessagesIn = Callable[[str, int, int], None]   # (topic, message count, bytes)
DlqCounter = Callable[[str], None]             # (consumer_group) per message sent to a DLQ
_MAX_CHECKED_SENDS = 65_536     # (topic, queue_id, group) triples remembered as checked
_SUCCESS = int(ResponseCode.SUCCESS)


def check_put(result: PutMessageResult) -> None:
    """Raise the error a failed put is answered with (MESSAGE_ILLEGAL, SERVICE_NOT_AVAILABLE,
    SYSTEM_ERROR); return for PUT_OK."""
    if result.status is PutMessageStatus.PUT_OK:
        return
    if result.status is PutMessageStatus.MESSAGE_ILLEGAL:
        raise MessageIllegal("message refused by the store (size, properties or DELAY level)")
    if result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE:
        raise ServiceNotAvailable(result.remark or "store refused the message: SERVICE_NOT_AVAILABLE")
    raise SystemError_(f"store refused the message: {result.status.name}")


Put = Callable[[], tuple[RemotingCommand, int]]
"""Stores a message (raising the put's error); returns its response and its record's commit-log end."""
Answer = RemotingCommand | Deferred


class TopicDurability(Protocol):
    """Whether a topic's config is on disk (`TopicConfigManager`, a `DurableTable`)."""

    def is_durable(self, key: str) -> bool: ...

    def when_durable(self, key: str | None, done: Durable) -> None: ...


def answer_put(store: MessageStore, topics: TopicDurability, topic: str, put: Put,
               recheck: Callable[[], object] = lambda: None) -> Answer:
    """`put` now, answered as `answer_when_durable` answers, when the config of `topic` (where the
    message is stored) is on disk: the usual case. Otherwise (this send, or a request just before
    it, created or changed the topic) a `Deferred`: once that config's write is done, `recheck`
    (the topic's send checks again: it may have changed meanwhile) and `put` run and the answer
    follows the fsync, so an acknowledged message is never in a topic a kill -9 makes the broker
    forget. Sends waiting for one topic are stored in the order they came (the writes' callbacks
    run in order, before any later request is read). Raises what `put` raises; the `Deferred`
    gets `ServiceNotAvailable` when the config could not be written (nothing is stored then)."""
    if topics.is_durable(topic):
        response, end_offset = put()
        return answer_when_durable(store, end_offset, response)
    reply = Deferred()

    def attempt(error: Exception | None) -> None:
        if reply.done():                   # given up (the broker is stopping): store nothing
            return
        if error is not None:
            reply.set_exception(error)
            return
        try:
            recheck()
            if not topics.is_durable(topic):          # changed again meanwhile
                topics.when_durable(topic, attempt)
                return
            response, end_offset = put()
        except Exception as exc:
            reply.set_exception(exc)
            return
        if store.is_durable(end_offset):
            reply.set_result(response)
        else:
            store.resolve_when_flushed(end_offset, reply, response)
    topics.when_durable(topic, attempt)
    return reply


def answer_when_durable(store: MessageStore, end_offset: int,
                        response: RemotingCommand) -> RemotingCommand | Deferred:
    """`response` now when the commit log is durable up to `end_offset` (ASYNC_FLUSH), else a
    `Deferred` of it that the group commit covering `end_offset` resolves (FLUSH_DISK_TIMEOUT past
    `sync_flush_timeout_ms`), which writes the response right there: no task, coroutine or future
    per waiting request. Stored messages are counted at put time either way, as RocketMQ's store
    statistics are."""
    if store.is_durable(end_offset):
        return response
    reply = Deferred()
    store.resolve_when_flushed(end_offset, reply, response)
    return reply


class SendMessageProcessor:
    """`max_message_bytes` bounds a message's body and properties together, `max_properties_bytes`
    its properties (RocketMQ's properties string, `properties_bytes`): over either, MESSAGE_ILLEGAL
    naming the limit; so does a header integer out of its range (`SendMessageRequestHeader`)."""

    def __init__(self, store: MessageStore, topics: TopicConfigManager, store_host: str,
                 max_message_bytes: int, on_stored: MessagesIn, retry_topics: RetryTopics,
                 on_dlq: DlqCounter, max_properties_bytes: int = MAX_PROPERTIES_BYTES,
                 transactions: TransactionBridge | None = None, timer: TimerSends | None = None,
                 dedup: DedupSends | None = None, trace: TraceRecorder | None = None) -> None:
        self._store, self._topics, self._store_host = store, topics, store_host
        self._dedup = dedup or DedupSends(store.dedup, lambda: 0)   # DEDUP sends (store.dedup_window_ms)
        self._trace = trace                     # None: the message trace is off
        self._transactions = transactions       # None: TRAN_MSG sends refused
        self._max_message_bytes = max_message_bytes
        self._max_properties_bytes = max_properties_bytes
        self._on_stored = on_stored
        self._retry_topics, self._on_dlq = retry_topics, on_dlq
        self._timer = timer or TimerSends(lambda: 0, 0)
        self._msg_id_prefix = msg_id_prefix(store_host)
        self._checked: set[tuple[str, int, str]] = set()
        self._checked_version = -1

    def process(self, ctx: RequestContext, request: RemotingCommand) -> Answer:
        """The response at once when the put is already durable (ASYNC_FLUSH), else a `Deferred`
        of it that the group commit covering the put resolves (SYNC_FLUSH), also when
        the topic's config must be written first (`answer_put`).

        The usual send (`usual_send`: every field of its exact type and within its range, no
        DELAY, timer or DEDUP property, properties plainly within their bound; and a topic and
        group already checked for this topic-config version, so no retry topic) reads the `ext`
        map in one call (C when built) and writes the response map directly: building and checking
        the header dataclasses was a fifth of the broker's Python time per one-at-a-time send.
        Anything else takes `_process_typed`, which checks field by field and raises the errors
        the protocol names."""
        usual = usual_send(request.fields, request.body, self._max_properties_bytes, self._max_message_bytes)
        if usual is None:
            return self._process_typed(ctx, request)
        topic, queue_id, group, flag, born_timestamp, reconsume_times, properties = usual
        if (topic, queue_id, group) not in self._checked_sends():
            return self._process_typed(ctx, request)
        body: bytes = request.body  # type: ignore[assignment]    # (checked by `usual_send`; no `cast`: a call)
        if PROPERTY_TRANSACTION_PREPARED in properties:     # a half message: the same checks passed
            if properties[PROPERTY_TRANSACTION_PREPARED] != "true" or self._transactions is None:
                return self._process_typed(ctx, request)
            response, end_offset = self._put_half(request, self._transactions, topic, queue_id, body,
                                                  {**properties, PROPERTY_PRODUCER_GROUP: group}, flag,
                                                  born_timestamp, ctx.client_addr, reconsume_times)
            return answer_when_durable(self._store, end_offset, response)
        result = self._store.put_checked_message(
            topic=topic, queue_id=queue_id, body=body, properties=properties, flag=flag,
            born_timestamp=born_timestamp, born_host=ctx.client_addr, reconsume_times=reconsume_times)
        check_put(result)
        commit_log_offset, queue_offset = result.commit_log_offsets[0], result.queue_offset
        response = (send_response(request.opaque, self._msg_id_prefix, commit_log_offset, queue_id, queue_offset)
                    or send_response_py(request.opaque, self._msg_id_prefix, commit_log_offset, queue_id, queue_offset))
        self._on_stored(topic, 1, len(body))
        if self._trace is not None:
            self._trace.sent_usual(ctx.client_addr, group, topic, queue_id, queue_offset)
        return answer_when_durable(self._store, result.end_offset, response)

    def _checked_sends(self) -> set[tuple[str, int, str]]:
        """(topic, queue_id, producer_group) of sends that passed the name and topic checks under
        the current topic configs (emptied whenever a topic changes, so a send to a topic made
        read-only, deleted or shrunk is checked again)."""
        if self._checked_version != self._topics.version:
            self._checked.clear()
            self._checked_version = self._topics.version
        return self._checked

    def _process_typed(self, ctx: RequestContext, request: RemotingCommand) -> Answer:
        header = SendMessageRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        require_group_name(header.producer_group)
        body = request.body_bytes()
        check_message_size(len(body), header.properties, self._max_message_bytes, self._max_properties_bytes)
        topic, queue_id, properties = header.topic, header.queue_id, header.properties
        require_sendable(topic)
        refusal = self._store.write_refusal         # create no topic for a send that is refused
        if refusal is not None:
            raise ServiceNotAvailable(refusal)
        if properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
            return self._prepare(ctx, request, header, body)
        dlq_group = None
        if topic[0] == "%":                 # %RETRY%<group>: the consumer's fallback path (§9)
            topic, queue_id, properties, dlq_group = self._retry_topics.route_send(
                topic, queue_id, header.reconsume_times, header.max_reconsume_times, properties)
        if PROPERTY_DELAY_TIME_LEVEL in properties:
            _check_delay_level(properties[PROPERTY_DELAY_TIME_LEVEL])
        timer_due_ms = self._timer.due_ms(properties)     # raises MessageIllegal; None: not a timer message
        if timer_due_ms is None:
            properties = self._timer.plain(properties)
        topics = self._topics
        topics.for_send(topic, queue_id)
        if (dlq_group is None and topic[0] != "%" and topics.is_durable(topic)
                and len(self._checked_sends()) < _MAX_CHECKED_SENDS):
            self._checked.add((topic, queue_id, header.producer_group))

        def put() -> tuple[RemotingCommand, int]:
            original = self._dedup.original(header.producer_group, properties)
            if original is not None:        # stored once already: answered as it was
                return request.response(header=SendMessageResponseHeader(
                    msg_id=make_msg_id(self._store_host, original.commit_log_offset), queue_id=original.queue_id,
                    queue_offset=original.queue_offset)), original.end_offset
            put_topic, put_queue_id, put_properties = self._timer.route(
                topic, queue_id, self._dedup.stamp(header.producer_group, properties), timer_due_ms)
            result = self._store.put_message(
                topic=put_topic, queue_id=put_queue_id, body=body, properties=put_properties,
                flag=header.flag, born_timestamp=header.born_timestamp, born_host=ctx.client_addr,
                reconsume_times=header.reconsume_times)
            check_put(result)
            self._dedup.remember(header.producer_group, [put_properties], result, put_queue_id)
            response = request.response(header=SendMessageResponseHeader(
                msg_id=make_msg_id(self._store_host, result.commit_log_offsets[0]),
                queue_id=header.queue_id, queue_offset=result.queue_offset))
            self._stored(topic, 1, len(body), dlq_group)
            if self._trace is not None:     # a delayed message's place is known once delivered (-1)
                self._trace.sent(ctx, header.producer_group, topic, queue_id, result.queue_offset if put_topic == topic
                                 and PROPERTY_DELAY_TIME_LEVEL not in put_properties else -1,
                                 result.commit_log_offsets[0], put_properties)
            return response, result.end_offset
        return answer_put(self._store, topics, topic, put, lambda: topics.for_send(topic, queue_id))

    def _prepare(self, ctx: RequestContext, request: RemotingCommand, header: SendMessageRequestHeader,
                 body: bytes) -> Answer:
        """A half message (TRAN_MSG "true", RocketMQ `SendMessageProcessor`'s transactional branch):
        stored by the transaction bridge; the answer's queue_offset is its offset in the half
        queue (the END_TRANSACTION `tran_state_table_offset`), its queue_id the real one. Refused:
        no bridge (NO_PERMISSION, as a broker with transactions off), a retry topic or a DELAY
        level (MESSAGE_ILLEGAL: a half message is neither retried nor delayed)."""
        transactions = self._transactions
        topic, queue_id, properties = header.topic, header.queue_id, header.properties
        if transactions is None:
            raise NoPermission("this broker does not take transactional messages")
        if topic[0] == "%" or PROPERTY_DELAY_TIME_LEVEL in properties:
            raise MessageIllegal("a transactional message cannot go to a retry topic or have a DELAY level")
        topics = self._topics
        topics.for_send(topic, queue_id)
        if topics.is_durable(topic) and len(self._checked_sends()) < _MAX_CHECKED_SENDS:
            self._checked.add((topic, queue_id, header.producer_group))     # the next ones take `process`'s path
        # checked back on the group that sent it, whatever PGROUP the client wrote
        properties = {**properties, PROPERTY_PRODUCER_GROUP: header.producer_group}

        def put() -> tuple[RemotingCommand, int]:
            return self._put_half(request, transactions, topic, queue_id, body, properties, header.flag,
                                  header.born_timestamp, ctx.client_addr, header.reconsume_times)
        return answer_put(self._store, topics, topic, put, lambda: topics.for_send(topic, queue_id))

    def _put_half(self, request: RemotingCommand, transactions: TransactionBridge, topic: str, queue_id: int,
                  body: bytes, properties: dict[str, str], flag: int, born_timestamp: int, born_host: str,
                  reconsume_times: int) -> tuple[RemotingCommand, int]:
        """Store a checked half message; its SEND_OK response and commit-log end."""
        result = transactions.prepare(topic=topic, queue_id=queue_id, body=body, properties=properties, flag=flag,
                                      born_timestamp=born_timestamp, born_host=born_host,
                                      reconsume_times=reconsume_times)
        check_put(result)
        if self._trace is not None:
            self._trace.sent_half(born_host, properties.get(PROPERTY_PRODUCER_GROUP, ""), topic, queue_id,
                                  result.queue_offset, result.commit_log_offsets[0], properties)
        return RemotingCommand(_SUCCESS, request.opaque, FLAG_RESPONSE, None, {
            "msg_id": self._msg_id_prefix + f"{result.commit_log_offsets[0]:016X}",
            "queue_id": queue_id, "queue_offset": result.queue_offset}), result.end_offset

    def _stored(self, topic: str, count: int, size_bytes: int, dlq_group: str | None) -> None:
        self._on_stored(topic, count, size_bytes)
        if dlq_group is not None:
            self._on_dlq(dlq_group)

    def process_batch(self, ctx: RequestContext, request: RemotingCommand) -> Answer:
        """SEND_BATCH_MESSAGE: the batch's messages appended to one queue, answered as `process`
        answers. The usual batch (every header field of its exact type, a topic and group already
        checked for this topic-config version) reads the `ext` map directly and writes the response
        map directly; anything else is checked field by field first, with the protocol's errors."""
        fields = request.fields
        topic = fields.get("topic")
        queue_id = fields.get("queue_id")
        group = fields.get("producer_group")
        born_timestamp = fields.get("born_timestamp", 0)
        if (type(topic) is not str or type(queue_id) is not int or type(group) is not str
                or type(born_timestamp) is not int or not 0 <= born_timestamp <= INT64_MAX
                or (topic, queue_id, group) not in self._checked_sends()):
            header = SendBatchMessageRequestHeader.from_fields(fields)
            topic, queue_id, group, born_timestamp = (header.topic, header.queue_id, header.producer_group,
                                                      header.born_timestamp)
            require_topic_name(topic)
            require_group_name(group)
            require_sendable(topic)
            if topic[0] == "%":
                raise NoPermission(f"topic {topic!r} is a system topic: batches cannot be sent to it")
            checked = False
        else:
            checked = True
        messages, body_bytes = decode_batch(request.body_bytes(), self._max_message_bytes,
                                            self._max_properties_bytes)
        topics = self._topics
        if not checked:
            refusal = self._store.write_refusal     # create no topic for a batch that is refused
            if refusal is not None:
                raise ServiceNotAvailable(refusal)
            topics.for_send(topic, queue_id)
            if topics.is_durable(topic) and len(self._checked_sends()) < _MAX_CHECKED_SENDS:
                self._checked.add((topic, queue_id, group))

        transactions = self._transactions if half_batch(messages) else None
        if transactions is None and PROPERTY_TRANSACTION_PREPARED in messages[0][0]:
            raise NoPermission("this broker does not take transactional messages")

        def put() -> tuple[RemotingCommand, int]:
            # checked: the topic name and queue (above, or for this topic-config version), and the
            # items (`decode_batch`: non-empty, each message within max_message_bytes, no DELAY)
            if transactions is not None:    # half messages, checked back on the group that sent them
                result = transactions.prepare_batch(topic=topic, queue_id=queue_id, messages=messages,
                                                    producer_group=group, born_timestamp=born_timestamp,
                                                    born_host=ctx.client_addr)
                check_put(result)
                if self._trace is not None:
                    self._trace.sent_halves(ctx.client_addr, group, topic, queue_id, result, len(messages))
                return RemotingCommand(_SUCCESS, request.opaque, FLAG_RESPONSE, None, {
                    "msg_ids": offset_msg_ids(self._msg_id_prefix, result.commit_log_offsets),
                    "queue_id": queue_id, "queue_offset": result.queue_offset}), result.end_offset
            fresh, originals, keys = self._dedup.split(group, messages)
            if originals is not None:       # some stored before (DEDUP): answered as they were
                offsets, answer_queue_id, queue_offset, end_offset = self._dedup.answer_batch(
                    fresh, originals, queue_id, lambda items: store_batch(items, keys))
                return RemotingCommand(_SUCCESS, request.opaque, FLAG_RESPONSE, None, {
                    "msg_ids": offset_msg_ids(self._msg_id_prefix, offsets), "queue_id": answer_queue_id,
                    "queue_offset": queue_offset}), end_offset
            result = store_batch(messages, keys)
            response = RemotingCommand(_SUCCESS, request.opaque, FLAG_RESPONSE, None, {
                "msg_ids": offset_msg_ids(self._msg_id_prefix, result.commit_log_offsets),
                "queue_id": queue_id, "queue_offset": result.queue_offset})
            return response, result.end_offset

        def store_batch(items: BatchItems, keys: list[str | None] | None) -> PutMessageResult:
            result = self._store.put_checked_messages(topic=topic, queue_id=queue_id, messages=items,
                                                      born_timestamp=born_timestamp, born_host=ctx.client_addr)
            check_put(result)
            if keys is not None:        # (None: the dedup window is off)
                self._dedup.remember_keys(group, keys, result, queue_id)
            self._on_stored(topic, len(items), body_bytes if items is messages else sum(len(i[2]) for i in items))
            if self._trace is not None:
                self._trace.sent_batch(ctx, group, topic, queue_id, result.queue_offset, len(items))
            return result
        return answer_put(self._store, topics, topic, put, lambda: topics.for_send(topic, queue_id))


def _check_delay_level(text: str) -> None:
    try:
        int(text)
    except ValueError:
        raise MessageIllegal(f"DELAY must be an integer delay level, got {text[:20]!r}") from None
