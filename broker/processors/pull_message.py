"""PULL_MESSAGE (REFERENCE.md §1, §2, §3 with PROTOCOL.md's deliberate differences).

A pull is answered in the loop step it arrives in: check group, topic, queue and subscription,
read from the store, answer. Only a pull that is long-pollable (PULL_NOT_FOUND) and carries SUSPEND
with a positive `suspend_timeout_ms` is held: it goes to the `HoldService` and the handler returns
a `Deferred` the dispatcher answers from. The hold service hands the pull back to `answer` when a matching
message arrives (in the arrival's own loop step), at the deadline, or at a stop; `answer` reads once
more, once for all the pulls woken together at the same place, and a woken pull that found its
messages is written to its connection right there (before the send that woke it is even
acknowledged); anything else resolves the `Deferred` for the dispatcher to write.
The committed offset (COMMIT_OFFSET flag) is stored on the first read, before any hold, as RocketMQ
does. The response body is the stored messages side by side, never decoded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple, cast

from broker.filter.filter_manager import FilterManager, NotCompiled, build_tag_filter
from broker.filter.message_filter import MessageFilter, RetryMessageFilter, SqlMessageFilter, TagMessageFilter
from broker.longpoll.hold_service import HeldPull, HoldService
from broker.offset.consumer_offset_manager import ConsumerOffsetManager
from broker.processors.pull_status import to_response_code
from broker.processors.validate import require_group_name, require_non_negative, require_topic_name
from broker.registry.consumer_manager import ConsumerManager
from broker.remoting.context import RequestContext
from broker.remoting.dispatcher import Deferred, settle_written
from broker.store.message_store import MessageStore
from broker.store.results import GetMessageResult, GetMessageStatus
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from broker.trace.recorder import TraceRecorder
from conf.broker import LongPollingConfig
from protocol.channel import Channel
from protocol.codes import FLAG_RESPONSE, PullSysFlag, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import (
    NoPermission,
    SubscriptionNotExist,
    SubscriptionNotLatest,
    SubscriptionParseFailed,
    SystemBusy,
    SystemError_,
)
from protocol.headers import PullMessageRequestHeader
from protocol.model import ExpressionType, MessageModel
from protocol.subscription import is_subscribe_all
from protocol.topics import is_retry_topic

MAX_MSG_NUMS = 1024
_COMPILE_ROUNDS = 8     # a pull compiling its expressions gives up (SYSTEM_BUSY) if they keep being evicted
# Plain ints: IntFlag arithmetic costs microseconds and every pull tests these bits.
_COMMIT_OFFSET, _SUSPEND, _SUBSCRIPTION = int(PullSysFlag.COMMIT_OFFSET), int(PullSysFlag.SUSPEND), \
    int(PullSysFlag.SUBSCRIPTION)
_SUCCESS, _PULL_NOT_FOUND = int(ResponseCode.SUCCESS), int(ResponseCode.PULL_NOT_FOUND)
_RETRY_IMMEDIATELY = int(ResponseCode.PULL_RETRY_IMMEDIATELY)
_BACKED_UP = "the connection's unread responses are over max_unsent_bytes_per_connection: pull again"
_NO_MESSAGE_IN_QUEUE = GetMessageStatus.NO_MESSAGE_IN_QUEUE
MessagesOut = Callable[[str, str, int, int], None]   # (group, topic, message count, bytes)
Answer = Deferred
"""A held pull's answer for the dispatcher: the response to write, or None once the response has
been written to the connection already."""
__all__ = ["MAX_MSG_NUMS", "PullMessageProcessor", "build_tag_filter", "response_fields"]


def response_fields(result: GetMessageResult) -> dict[str, Any]:
    """The `PullMessageResponseHeader` of a read, as its `ext` map (built directly: every pull)."""
    return {"next_begin_offset": result.next_begin_offset, "min_offset": result.min_offset,
            "max_offset": result.max_offset, "suggest_which_broker_id": 0}


class _Read(NamedTuple):
    """One read answering held pulls, and the parts of their responses they share."""

    result: GetMessageResult
    code: int
    remark: str
    fields: dict[str, Any]
    body: bytes | list[memoryview]


class _HeldRequest(HeldPull):
    """A held PULL_MESSAGE: the request to answer, on which connection, and the dispatcher's future."""

    __slots__ = ("answered", "channel", "consumer_group", "max_messages", "request")

    def __init__(self, header: PullMessageRequestHeader, max_messages: int, message_filter: MessageFilter | None,
                 processor: PullMessageProcessor, channel: Channel, request: RemotingCommand,
                 answered: Answer) -> None:
        super().__init__(header.topic, header.queue_id, header.queue_offset, message_filter, processor)
        self.consumer_group, self.max_messages = header.consumer_group, max_messages
        self.channel, self.request, self.answered = channel, request, answered


class _AwaitedAnswer(Deferred):
    """The answer of a held pull that a coroutine awaits (one that compiled its SQL92 filter first)
    instead of the dispatcher: resolved as any `Deferred` by the hold service, and `wait()` returns
    the response (None: written to the connection already) or raises its error."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        super().__init__()
        self._future: asyncio.Future[RemotingCommand | None] = asyncio.get_running_loop().create_future()

    def set_result(self, response: RemotingCommand | None) -> None:
        super().set_result(response)
        if not self._future.done():
            self._future.set_result(response)

    def set_exception(self, exc: BaseException) -> None:
        super().set_exception(exc)
        if not self._future.done():
            self._future.set_exception(exc)

    def cancel(self) -> None:
        super().cancel()
        self._future.cancel()

    async def wait(self) -> RemotingCommand | None:
        return await self._future


class PullMessageProcessor:
    def __init__(self, store: MessageStore, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 consumers: ConsumerManager, offsets: ConsumerOffsetManager, hold_service: HoldService,
                 long_polling: LongPollingConfig, on_pulled: MessagesOut, *,
                 filters: FilterManager | None = None, filter_support_retry: bool = False,
                 trace: TraceRecorder | None = None, slave_read_enable: bool = False) -> None:
        """`slave_read_enable`: a pull that found messages further behind the log end than
        `store.access_message_in_memory_max_ratio` % of RAM is answered with
        `suggest_which_broker_id` = the group's `which_broker_when_consume_slowly` (1: a slave),
        any other found pull with the group's `broker_id` (0: the master; from a slave, back to
        it), as RocketMQ's PullMessageProcessor. Else, and for held pulls (at the queue's end): 0."""
        self._trace = trace                     # None: the message trace is off
        self._slave_read_enable = slave_read_enable
        self._store, self._topics, self._groups = store, topics, groups
        self._consumers, self._offsets, self._hold = consumers, offsets, hold_service
        self._long_polling = long_polling
        self._on_pulled = on_pulled
        self._filters = filters if filters is not None else FilterManager(sql92_enabled=True)
        self._filter_support_retry = filter_support_retry

    def process(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand | Answer | \
            Coroutine[Any, Any, RemotingCommand | None]:
        """The response now, or, for a held pull, the `Deferred` of its answer; when its SQL92
        expression is not compiled yet, a coroutine answering once it was (off the loop)."""
        header = PullMessageRequestHeader.from_fields(request.fields)
        require_group_name(header.consumer_group)
        require_topic_name(header.topic)
        require_non_negative("queue_offset", header.queue_offset)
        max_messages = min(max(header.max_msg_nums, 1), MAX_MSG_NUMS)
        group_config = self._groups.find_or_create(header.consumer_group)
        if not group_config.consume_enable:
            raise NoPermission(f"consumer group {header.consumer_group!r} is not allowed to consume")
        self._topics.require_readable_queue(header.topic, header.queue_id)
        broadcast_enable = group_config.consume_broadcast_enable
        try:
            message_filter = self._message_filter(header, broadcast_enable, compile_now=False)
        except NotCompiled as pending:
            return self._pull_compiled(ctx, request, header, max_messages, broadcast_enable, pending.text)
        return self._pull(ctx, request, header, max_messages, message_filter)

    async def _pull_compiled(self, ctx: RequestContext, request: RemotingCommand, header: PullMessageRequestHeader,
                             max_messages: int, broadcast_enable: bool, text: str) -> RemotingCommand | None:
        """The pull once its expression(s) were compiled in a thread, held as any other; None when
        the hold service wrote the response itself."""
        for _ in range(_COMPILE_ROUNDS):
            await self._filters.compile_async(text)
            try:
                message_filter = self._message_filter(header, broadcast_enable, compile_now=False)
            except NotCompiled as pending:
                text = pending.text
                continue
            answered = self._pull(ctx, request, header, max_messages, message_filter, awaited=True)
            if isinstance(answered, _AwaitedAnswer):
                return await answered.wait()
            assert isinstance(answered, RemotingCommand)
            return answered
        raise SystemBusy(f"the SQL92 expressions of group {header.consumer_group!r} do not stay compiled: "
                         "raise sql92_compile_cache_bytes")

    def _pull(self, ctx: RequestContext, request: RemotingCommand, header: PullMessageRequestHeader,
              max_messages: int, message_filter: MessageFilter | None, *,
              awaited: bool = False) -> RemotingCommand | Answer:
        """Read, commit the offset (COMMIT_OFFSET flag), then answer or hold; `awaited`: a held pull's
        answer is an `_AwaitedAnswer` for a coroutine to await, not one for the dispatcher."""
        result = self._read(header.topic, header.queue_id, header.queue_offset, max_messages, message_filter)
        code = to_response_code(result.status, header.queue_offset)
        if header.sys_flag & _COMMIT_OFFSET:
            require_non_negative("commit_offset", header.commit_offset)
            self._offsets.commit(ctx.client_addr, header.consumer_group, header.topic, header.queue_id,
                                 header.commit_offset)
        if code == _PULL_NOT_FOUND and header.sys_flag & _SUSPEND and header.suspend_timeout_ms > 0:
            answered = self._hold_pull(ctx.channel, request, header, max_messages, message_filter,
                                       _AwaitedAnswer() if awaited else Deferred())
            if answered is not None:
                return answered
        if self._trace is not None and result.messages:
            self._trace.pulled(ctx.channel, header.consumer_group, header.topic, header.queue_id, header.queue_offset,
                               result.next_begin_offset, len(result.messages))
        return self._respond(request, header.consumer_group, header.topic, header.queue_id, result, code)

    def _hold_pull(self, channel: Channel, request: RemotingCommand, header: PullMessageRequestHeader,
                   max_messages: int, message_filter: MessageFilter | None, answered: Answer) -> Answer | None:
        """Hold the pull (long polling, else short polling); None when it is not held (the broker is
        stopping, or, long polling, the queue already holds messages past the offset, e.g. a read
        that found a hole: the answer is the read just made)."""
        if self._long_polling.enable:
            if self._store.get_max_offset(header.topic, header.queue_id) > header.queue_offset:
                return None
            timeout_ms, wake_on_arrival = header.suspend_timeout_ms, True
        else:
            timeout_ms = min(self._long_polling.short_polling_time_ms, header.suspend_timeout_ms)
            wake_on_arrival = False
        pull = _HeldRequest(header, max_messages, message_filter, self, channel, request, answered)
        if not self._hold.hold(pull, timeout_ms, wake_on_arrival=wake_on_arrival):
            return None
        return answered

    def answer(self, pulls: list[HeldPull], woken: bool) -> None:
        """The hold service hands back held pulls of one queue (`PullResponder`): read once per
        (queue_offset, max_messages, filter) and answer each; pulls answered from one read share
        its header map and body. A woken pull that found messages is written to its connection
        now, and these are settled with the dispatcher together at the end (`settle_written`);
        other answers (the deadline, a stop, an error) resolve their `Deferred` for the
        dispatcher to write. A pull whose connection does not take its responses (the transport
        is over its high-water mark, `max_unsent_bytes_per_connection`) is answered
        PULL_RETRY_IMMEDIATELY without messages (`next_begin_offset` its own offset, so the
        consumer pulls the same messages again later): thousands of held pulls of a peer that
        never reads must not turn one arrival into thousands of copies of the message."""
        reads: dict[tuple[int, int, MessageFilter | None], _Read] = {}
        written: list[Deferred] = []      # answered on their connections here, settled in one pass
        pulled: dict[tuple[str, str], list[int]] = {}     # (group, topic) -> [messages, bytes]
        record_pull = self._offsets.record_pull
        trace = self._trace
        for pull in cast(list[_HeldRequest], pulls):
            answered = pull.answered
            if answered.done():         # the dispatcher gave up on it (cancelled at a stop)
                continue
            if pull.channel.write_paused:
                answered.set_result(self._backed_up(pull))
                continue
            try:
                key = (pull.queue_offset, pull.max_messages, pull.message_filter)
                read = reads.get(key)
                if read is None:
                    read = reads[key] = self._read_for(pull, shared=len(pulls) > 1)
                result, code, remark, fields, body = read
                if result.status is not _NO_MESSAGE_IN_QUEUE:
                    record_pull(pull.consumer_group, pull.topic, pull.queue_id, result.next_begin_offset)
            except Exception as exc:
                answered.set_exception(exc)
                continue
            if result.messages:
                counts = pulled.get((pull.consumer_group, pull.topic))
                if counts is None:
                    pulled[(pull.consumer_group, pull.topic)] = [len(result.messages), result.total_bytes]
                else:
                    counts[0] += len(result.messages)
                    counts[1] += result.total_bytes
                if trace is not None:
                    trace.pulled(pull.channel, pull.consumer_group, pull.topic, pull.queue_id, pull.queue_offset,
                                 result.next_begin_offset, len(result.messages))
            response = RemotingCommand(code, pull.request.opaque, FLAG_RESPONSE, remark, fields, body)
            if woken and code == _SUCCESS:
                channel = pull.channel
                if not channel.closed:          # (a closed one has nobody to answer)
                    channel.send(response)
                written.append(answered)
            else:
                answered.set_result(response)
        settle_written(written)
        for (consumer_group, topic), (count, size_bytes) in pulled.items():
            self._on_pulled(consumer_group, topic, count, size_bytes)

    def _backed_up(self, pull: _HeldRequest) -> RemotingCommand:
        store = self._store
        return RemotingCommand(_RETRY_IMMEDIATELY, pull.request.opaque, FLAG_RESPONSE, _BACKED_UP, {
            "next_begin_offset": pull.queue_offset, "min_offset": store.get_min_offset(pull.topic, pull.queue_id),
            "max_offset": store.get_max_offset(pull.topic, pull.queue_id), "suggest_which_broker_id": 0})

    def _read_for(self, pull: _HeldRequest, *, shared: bool) -> _Read:
        result = self._read(pull.topic, pull.queue_id, pull.queue_offset, pull.max_messages, pull.message_filter)
        body: bytes | list[memoryview] = result.messages
        if shared and len(result.messages) > 0:
            body = b"".join(result.messages)    # one copy for all the responses, not one each
        return _Read(result, to_response_code(result.status, pull.queue_offset), result.status.name,
                     response_fields(result), body)

    def _respond(self, request: RemotingCommand, consumer_group: str, topic: str, queue_id: int,
                 result: GetMessageResult, code: int) -> RemotingCommand:
        if result.status is not _NO_MESSAGE_IN_QUEUE:
            self._offsets.record_pull(consumer_group, topic, queue_id, result.next_begin_offset)
        fields = response_fields(result)
        if result.messages:
            self._on_pulled(consumer_group, topic, len(result.messages), result.total_bytes)
            if self._slave_read_enable:
                fields["suggest_which_broker_id"] = self._suggest(consumer_group, topic, queue_id, result)
        return RemotingCommand(code, request.opaque, FLAG_RESPONSE, result.status.name, fields, result.messages)

    def _suggest(self, consumer_group: str, topic: str, queue_id: int, result: GetMessageResult) -> int:
        """The broker id the next pull should go to (RocketMQ's suggestPullingFromSlave): the last
        unit read lies further behind the log end than the memory ratio allows -> a slave."""
        group = self._groups.get(consumer_group)
        if group is None:
            return 0
        behind = self._store.check_in_disk_by_consume_offset(topic, queue_id, result.next_begin_offset - 1)
        return group.which_broker_when_consume_slowly if behind else group.broker_id

    def _read(self, topic: str, queue_id: int, queue_offset: int, max_messages: int,
              message_filter: MessageFilter | None) -> GetMessageResult:
        matched = self._filters.matches(message_filter, topic, queue_id)
        return self._store.get_message(topic, queue_id, queue_offset, max_messages, message_filter, matched)

    def _message_filter(self, header: PullMessageRequestHeader, broadcast_enable: bool, *,
                        compile_now: bool) -> MessageFilter | None:
        """The subscription of this pull: from the request with the SUBSCRIPTION flag, else the one
        the group registered by heartbeat (REFERENCE.md §1 step 6); a retry topic's pull is wrapped
        in a `RetryMessageFilter` when `filter_support_retry` is on (step 8). Raises `NotCompiled`
        when `compile_now` is False and an SQL92 expression it needs is not compiled yet."""
        group, topic = header.consumer_group, header.topic
        message_filter: MessageFilter | None
        if header.sys_flag & _SUBSCRIPTION:
            message_filter = self._filters.build(group, topic, header.expression_type, header.subscription,
                                                 header.sub_version, compile_now=compile_now)
        else:
            group_info = self._consumers.get(group)
            if group_info is None:
                raise SubscriptionNotExist(f"consumer group {group!r} is not online "
                                           "(send HEART_BEAT first, or pull with the SUBSCRIPTION flag)")
            if group_info.message_model is MessageModel.BROADCASTING and not broadcast_enable:
                raise NoPermission(f"group {group!r} may not consume in broadcasting mode")
            sub = group_info.subscriptions.get(topic)
            if sub is None:
                raise SubscriptionNotExist(f"group {group!r} has no subscription to topic {topic!r}")
            if sub.sub_version < header.sub_version:
                raise SubscriptionNotLatest(f"subscription of {group!r} to {topic!r} is older than the "
                                            "pull's sub_version")
            if sub.expression_type == ExpressionType.TAG:
                message_filter = None if is_subscribe_all(sub.sub_string) else TagMessageFilter(sub.code_set)
            elif sub.expression_type == ExpressionType.SQL92:
                message_filter = self._filters.sql_filter(group, topic, sub.sub_version, sub.sub_string,
                                                          compile_now=compile_now)
            else:
                raise SubscriptionParseFailed(f"unknown expression_type {sub.expression_type!r} (TAG or SQL92)")
        if message_filter is None and self._filter_support_retry and is_retry_topic(topic):
            group_info = self._consumers.get(group)
            for sub in group_info.subscriptions.values() if group_info is not None and not compile_now else ():
                if self._filters.pending(sub.expression_type, sub.sub_string):
                    raise NotCompiled(sub.sub_string)       # read below through `_registered_sql_filter`
            return RetryMessageFilter(lambda original_topic: self._registered_sql_filter(group, original_topic))
        return message_filter

    def _registered_sql_filter(self, group: str, topic: str) -> SqlMessageFilter | None:
        """The group's registered SQL92 filter for `topic`, None when it has none (or it does not
        compile: the group's pulls of that topic are refused anyway)."""
        group_info = self._consumers.get(group)
        sub = group_info.subscriptions.get(topic) if group_info is not None else None
        if sub is None or sub.expression_type != ExpressionType.SQL92:
            return None
        try:
            return self._filters.sql_filter(group, topic, sub.sub_version, sub.sub_string)
        except (SubscriptionParseFailed, SystemError_):
            return None
