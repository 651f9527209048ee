"""PULL_MESSAGE (REFERENCE.md §1, §2, §3 with PROTOCOL.md's deliberate differences).

One coroutine per pull: check group, topic, queue and subscription; read from the store; if the
result is long-pollable (PULL_NOT_FOUND) and the request carries SUSPEND with a positive
`suspend_timeout_ms`, hold it in the `HoldService` and read once more when woken or at the deadline.
The committed offset (COMMIT_OFFSET flag) is stored on the first read, before any hold, as RocketMQ
does. The response body is the stored messages side by side, never decoded."""

from __future__ import annotations

from collections.abc import Callable

from broker.filter.filter_manager import FilterManager, build_tag_filter
from broker.filter.message_filter import MessageFilter, RetryMessageFilter, SqlMessageFilter, TagMessageFilter
from broker.longpoll.hold_service import HoldService
from broker.offset.consumer_offset_manager import ConsumerOffsetManager
from broker.processors.pull_status import to_response_code
from broker.processors.validate import require_group_name, require_non_negative, require_topic_name
from broker.registry.consumer_manager import ConsumerManager
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.store.results import GetMessageResult, GetMessageStatus
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from conf.broker import LongPollingConfig
from protocol.codes import PullSysFlag, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import (
    NoPermission,
    SubscriptionNotExist,
    SubscriptionNotLatest,
    SubscriptionParseFailed,
    SystemError_,
)
from protocol.headers import PullMessageRequestHeader, PullMessageResponseHeader
from protocol.model import ExpressionType, MessageModel
from protocol.subscription import is_subscribe_all
from protocol.topics import is_retry_topic

MAX_MSG_NUMS = 1024
# Plain ints: IntFlag arithmetic costs microseconds and every pull tests these bits.
_COMMIT_OFFSET, _SUSPEND, _SUBSCRIPTION = int(PullSysFlag.COMMIT_OFFSET), int(PullSysFlag.SUSPEND), \
    int(PullSysFlag.SUBSCRIPTION)
MessagesOut = Callable[[str, str, int, int], None]   # (group, topic, message count, bytes)
__all__ = ["MAX_MSG_NUMS", "PullMessageProcessor", "build_tag_filter"]


class PullMessageProcessor:
    def __init__(self, store: MessageStore, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 consumers: ConsumerManager, offsets: ConsumerOffsetManager, hold_service: HoldService,
                 long_polling: LongPollingConfig, on_pulled: MessagesOut, *,
                 filters: FilterManager | None = None, filter_support_retry: bool = False) -> None:
        self._store, self._topics, self._groups = store, topics, groups
        self._consumers, self._offsets, self._hold = consumers, offsets, hold_service
        self._long_polling = long_polling
        self._on_pulled = on_pulled
        self._filters = filters if filters is not None else FilterManager(sql92_enabled=True)
        self._filter_support_retry = filter_support_retry

    async def process(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = PullMessageRequestHeader.from_fields(request.fields)
        require_group_name(header.consumer_group)
        require_topic_name(header.topic)
        require_non_negative("queue_offset", header.queue_offset)
        max_messages = min(max(header.max_msg_nums, 1), MAX_MSG_NUMS)
        group_config = self._groups.find_or_create(header.consumer_group)
        if not group_config.consume_enable:
            raise NoPermission(f"consumer group {header.consumer_group!r} is not allowed to consume")
        self._topics.require_readable_queue(header.topic, header.queue_id)
        message_filter = self._message_filter(header, group_config.consume_broadcast_enable)

        result = self._read(header, max_messages, message_filter)
        code = to_response_code(result.status, header.queue_offset)
        if header.sys_flag & _COMMIT_OFFSET:
            require_non_negative("commit_offset", header.commit_offset)
            self._offsets.commit(ctx.client_addr, header.consumer_group, header.topic, header.queue_id,
                                 header.commit_offset)
        if (code == ResponseCode.PULL_NOT_FOUND and header.sys_flag & _SUSPEND
                and header.suspend_timeout_ms > 0):
            if self._long_polling.enable:
                await self._hold.wait(header.topic, header.queue_id, header.queue_offset, message_filter,
                                      header.suspend_timeout_ms)
            else:
                await self._hold.wait(header.topic, header.queue_id, header.queue_offset, message_filter,
                                      min(self._long_polling.short_polling_time_ms, header.suspend_timeout_ms),
                                      wake_on_arrival=False)
            result = self._read(header, max_messages, message_filter)
            code = to_response_code(result.status, header.queue_offset)
        if result.status is not GetMessageStatus.NO_MESSAGE_IN_QUEUE:
            self._offsets.record_pull(header.consumer_group, header.topic, header.queue_id,
                                      result.next_begin_offset)
        if result.messages:
            self._on_pulled(header.consumer_group, header.topic, len(result.messages), result.total_bytes)
        return request.response(
            code, PullMessageResponseHeader(next_begin_offset=result.next_begin_offset,
                                            min_offset=result.min_offset, max_offset=result.max_offset,
                                            suggest_which_broker_id=0),
            body=result.messages, remark=result.status.name)

    def _read(self, header: PullMessageRequestHeader, max_messages: int,
              message_filter: MessageFilter | None) -> GetMessageResult:
        matched = self._filters.matches(message_filter, header.topic, header.queue_id)
        return self._store.get_message(header.topic, header.queue_id, header.queue_offset, max_messages,
                                       message_filter, matched)

    def _message_filter(self, header: PullMessageRequestHeader, broadcast_enable: bool) -> MessageFilter | None:
        """The subscription of this pull: from the request with the SUBSCRIPTION flag, else the one
        the group registered by heartbeat (REFERENCE.md §1 step 6); a retry topic's pull is wrapped
        in a `RetryMessageFilter` when `filter_support_retry` is on (step 8)."""
        group, topic = header.consumer_group, header.topic
        message_filter: MessageFilter | None
        if header.sys_flag & _SUBSCRIPTION:
            message_filter = self._filters.build(group, topic, header.expression_type, header.subscription,
                                                 header.sub_version)
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
                message_filter = self._filters.sql_filter(group, topic, sub.sub_version, sub.sub_string)
            else:
                raise SubscriptionParseFailed(f"unknown expression_type {sub.expression_type!r} (TAG or SQL92)")
        if message_filter is None and self._filter_support_retry and is_retry_topic(topic):
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
