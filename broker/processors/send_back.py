"""CONSUMER_SEND_MSG_BACK: a consumer hands back a message it failed to consume; it comes back later
through `%RETRY%<group>` with a growing delay, or goes to `%DLQ%<group>` (REFERENCE.md §9).

The same rule for a plain send to a `%RETRY%` topic (the client's fallback when the send-back itself
failed) lives in `broker.topics.retry_topics.RetryTopics.route_send`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.processors.send_message import Answer, answer_put, check_put
from broker.processors.validate import require_group_name
from broker.remoting.context import RequestContext
from broker.retry_policy import decide, dlq_reason, max_reconsume_times_of
from broker.store.message_store import MessageStore
from broker.topics.retry_topics import RetryTopics
from broker.topics.system_topics import NOT_ALLOWED_SEND_TOPICS
from broker.trace.recorder import TraceRecorder
from protocol.command import RemotingCommand
from protocol.errors import MessageIllegal, NoPermission, ServiceNotAvailable, SystemError_
from protocol.headers import INT32_MAX, INT32_MIN, INT64_MAX, ConsumerSendMsgBackRequestHeader
from protocol.message import (
    F_BODY,
    F_BORN_HOST,
    F_BORN_TIMESTAMP,
    F_FLAG,
    F_PROPERTIES,
    F_RECONSUME_TIMES,
    F_SYS_FLAG,
    F_TOPIC,
    MAX_PROPERTIES_BYTES,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_DLQ_REASON,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    make_msg_id,
    properties_bytes,
)

log = logging.getLogger(__name__)

DlqCounter = Callable[[str], None]          # (consumer_group) per message sent to a DLQ
RECONSUME_TIMES_MAX = 2**31 - 1             # Java's int `reconsumeTimes`: what every client can read
_MAX_CHECKED_GROUPS = 10_000                # group names remembered as valid (bounded memory)


class SendBackProcessor:
    """CONSUMER_SEND_MSG_BACK (36), RocketMQ `asyncConsumerSendMsgBack`."""

    def __init__(self, store: MessageStore, retry_topics: RetryTopics, store_host: str,
                 on_dlq: DlqCounter, max_properties_bytes: int = MAX_PROPERTIES_BYTES,
                 trace: TraceRecorder | None = None) -> None:
        self._store, self._retry, self._store_host = store, retry_topics, store_host
        self._trace = trace                     # None: the message trace is off
        self._on_dlq = on_dlq
        self._max_properties_bytes = max_properties_bytes
        self._checked_groups: set[str] = set()     # names that passed `require_group_name`

    def process(self, ctx: RequestContext, request: RemotingCommand) -> Answer:
        """Look the original up by `commit_log_offset` (SYSTEM_ERROR when no message starts there),
        then store a copy (same body, flag, properties, born time and host; `reconsume_times` + 1,
        never past 2^31-1: a stored count at that bound goes to the DLQ, `bounded_reconsume_times`;
        `RETRY_TOPIC` = the original topic unless already set; `ORIGIN_MESSAGE_ID` kept from the
        first attempt) in `%RETRY%<group>` with delay level `delay_level` (`3 + reconsume_times` when
        0), or in `%DLQ%<group>` past `max_reconsume_times` or for a negative level (with a
        `DLQ_REASON` property saying which, `dlq_reason`). SUCCESS without
        storing anything when the group's `retry_queue_nums` is 0. Answered as a SEND is: at once
        when the copy is durable (ASYNC_FLUSH), else through a `Deferred` the group commit resolves
        (no task per request; the DLQ counter counts at put time, as the SEND path's does); a
        retry or DLQ topic this request created is written to disk before the copy is stored
        (`answer_put`).

        A header integer out of its range (`ConsumerSendMsgBackRequestHeader`) is SYSTEM_ERROR as
        any bad field; an original whose properties are over `max_properties_bytes` (stored before
        that bound) is refused with MESSAGE_ILLEGAL; a stored `reconsume_times` past int32 (written by an older broker)
        counts as past every maximum, so the copy goes to the DLQ: a send-back never fails on it.

        The usual request (every field of its exact type and range, a group name already checked)
        reads the `ext` map directly, as the SEND path does: the typed header was ~1.2 µs of a
        send-back's ~22 µs of broker CPU. Anything else takes `_checked_header` and its errors."""
        ext = request.fields
        commit_log_offset = ext.get("commit_log_offset")
        group = ext.get("group")
        delay_level = ext.get("delay_level", 0)
        origin_msg_id = ext.get("origin_msg_id")
        origin_topic = ext.get("origin_topic")
        max_reconsume_times = ext.get("max_reconsume_times")
        if (type(commit_log_offset) is not int or not 0 <= commit_log_offset <= INT64_MAX or type(group) is not str
                or group not in self._checked_groups or type(delay_level) is not int
                or not INT32_MIN <= delay_level <= INT32_MAX
                or (origin_msg_id is not None and type(origin_msg_id) is not str)
                or (origin_topic is not None and type(origin_topic) is not str)
                or (max_reconsume_times is not None and (type(max_reconsume_times) is not int
                                                         or not INT32_MIN <= max_reconsume_times <= INT32_MAX))):
            header = self._checked_header(request)
            commit_log_offset, group, delay_level = header.commit_log_offset, header.group, header.delay_level
            origin_msg_id, max_reconsume_times = header.origin_msg_id, header.max_reconsume_times
        refusal = self._store.write_refusal         # create no retry topic for a refused copy
        if refusal is not None:
            raise ServiceNotAvailable(refusal)
        retry_queue = self._retry.retry_queue(group)
        if retry_queue is None:
            return request.response()
        fields = self._store.look_message_fields(commit_log_offset)
        if fields is None:
            raise SystemError_(f"no message starts at commit_log_offset {commit_log_offset}")
        if fields[F_TOPIC] in NOT_ALLOWED_SEND_TOPICS:     # e.g. a delayed message not yet delivered
            raise NoPermission(f"the message at commit_log_offset {commit_log_offset} is in system topic "
                               f"{fields[F_TOPIC]}: only messages a consumer received can be sent back")
        size = properties_bytes(fields[F_PROPERTIES])
        if size > self._max_properties_bytes:
            raise MessageIllegal(f"the message at commit_log_offset {commit_log_offset} has properties of {size} "
                                 f"bytes, over max_properties_bytes {self._max_properties_bytes}")
        properties: dict[str, str] = dict(fields[F_PROPERTIES])
        properties.setdefault(PROPERTY_RETRY_TOPIC, fields[F_TOPIC])
        if not properties.get(PROPERTY_ORIGIN_MESSAGE_ID):
            properties[PROPERTY_ORIGIN_MESSAGE_ID] = (origin_msg_id or
                                                      make_msg_id(self._store_host, commit_log_offset))
        reconsume_times = bounded_reconsume_times(fields[F_RECONSUME_TIMES])
        maximum = min(max_reconsume_times_of(max_reconsume_times, self._retry.retry_max_times(group)),
                      RECONSUME_TIMES_MAX)
        decision = decide(reconsume_times, delay_level, maximum, group)
        properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        if decision.to_dlq:
            topic, queue_id = self._retry.dlq_queue(group)
            properties[PROPERTY_DLQ_REASON] = dlq_reason(reconsume_times, delay_level, maximum)
            log.info("group %s: message %s reached %d reconsume times; sent to %s", group,
                     properties[PROPERTY_ORIGIN_MESSAGE_ID], reconsume_times, topic)
        else:
            topic, queue_id = retry_queue
            properties[PROPERTY_DELAY_TIME_LEVEL] = str(decision.delay_level)
        to_dlq = decision.to_dlq

        def put() -> tuple[RemotingCommand, int]:
            result = self._store.put_message(
                topic=topic, queue_id=queue_id, body=bytes(fields[F_BODY]), properties=properties,
                flag=fields[F_FLAG], born_timestamp=fields[F_BORN_TIMESTAMP], born_host=fields[F_BORN_HOST],
                reconsume_times=min(reconsume_times + 1, RECONSUME_TIMES_MAX), sys_flag=fields[F_SYS_FLAG])
            check_put(result)
            if to_dlq:
                self._on_dlq(group)
            if self._trace is not None:
                self._trace.sent_back(ctx, group, commit_log_offset, decision.delay_level, to_dlq, topic, queue_id,
                                      result.queue_offset, result.commit_log_offsets[0], properties)
            return request.response(), result.end_offset
        return answer_put(self._store, self._retry.topics, topic, put)

    def _checked_header(self, request: RemotingCommand) -> ConsumerSendMsgBackRequestHeader:
        """The typed header, field by field (raises the protocol's errors: a missing or mistyped
        field, a bad group name, an integer out of its range); a group that passes is remembered
        so its next requests read the fields directly."""
        header = ConsumerSendMsgBackRequestHeader.from_fields(request.fields)
        require_group_name(header.group)
        if len(self._checked_groups) < _MAX_CHECKED_GROUPS:
            self._checked_groups.add(header.group)
        return header


def bounded_reconsume_times(stored: object) -> int:
    """A stored message's `reconsume_times` within 0..`RECONSUME_TIMES_MAX` (2^31-1): a store can
    hold any msgpack integer there (an older broker, a client that sent 2^64-1), and neither the
    retry arithmetic nor a Java client's int may see more. A value at or past the maximum reaches
    any `max_reconsume_times` (itself bounded by it), so the message goes to the DLQ, stored with
    the maximum, never with one more; a negative or non-integer value counts as 0. Pure; raises
    nothing (RocketMQ reads the int as it is and would wrap to a negative count)."""
    if type(stored) is not int or stored < 0:
        return 0
    return min(stored, RECONSUME_TIMES_MAX)
