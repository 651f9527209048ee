"""HEART_BEAT and UNREGISTER_CLIENT → the consumer and producer registries (REFERENCE.md §7);
CHECK_CLIENT_CONFIG → the filter manager (§6 "Enabling")."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TypeVar

from broker.filter.filter_manager import FilterManager, NotCompiled
from broker.processors.validate import require_group_name, require_topic_name
from broker.registry.consumer_manager import ClientChannelInfo, ConsumerManager, Subscription
from broker.registry.limits import ClientIdTable, ConsumerGroupFull, TooManyClientIds
from broker.registry.producer_manager import ProducerManager
from broker.remoting.context import RequestContext
from broker.remoting.ratelimit import RateLimitedLog
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from protocol.bodies import CheckClientRequestBody, HeartbeatData, SubscriptionData, decode_body
from protocol.clock import Clock
from protocol.command import RemotingCommand
from protocol.errors import ResponseError, SubscriptionParseFailed, SystemError_
from protocol.headers import UnregisterClientRequestHeader
from protocol.model import ConsumeFromWhere, ConsumeType, ExpressionType, MessageModel
from protocol.subscription import is_subscribe_all, parse_tags, tags_code
from protocol.topics import check_group, retry_topic

E = TypeVar("E", bound=StrEnum)
Answer = RemotingCommand | Awaitable[RemotingCommand]   # the response now, or once an SQL92 compile is done
log = logging.getLogger(__name__)


def _enum(cls: type[E], value: str, name: str) -> E:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise SystemError_(f"{name} {value!r} is not one of {allowed}") from None


def to_subscription(data: SubscriptionData) -> Subscription:
    """A registered subscription; the tag set is rebuilt from `sub_string` (the client's
    `tags_set`/`code_set` are not trusted); raises `SubscriptionParseFailed`."""
    require_topic_name(data.topic)
    if data.expression_type not in (ExpressionType.TAG, ExpressionType.SQL92):
        raise SubscriptionParseFailed(f"unknown expression_type {data.expression_type!r} (TAG or SQL92)")
    tags: frozenset[str] = frozenset()
    if data.expression_type == ExpressionType.TAG and not is_subscribe_all(data.sub_string):
        try:
            tags = parse_tags(data.sub_string)
        except ValueError as exc:
            raise SubscriptionParseFailed(f"topic {data.topic!r}: {exc}") from None
    return Subscription(topic=data.topic, sub_string=data.sub_string or "*",
                        expression_type=data.expression_type, tags_set=tags,
                        code_set=frozenset(tags_code(t) for t in tags), sub_version=data.sub_version)


class ClientManageProcessor:
    def __init__(self, consumers: ConsumerManager, producers: ProducerManager,
                 groups: SubscriptionGroupManager, topics: TopicConfigManager, clock: Clock,
                 notify_enabled: Callable[[str], bool], filters: FilterManager | None = None,
                 client_ids: ClientIdTable | None = None) -> None:
        self._consumers, self._producers, self._groups, self._topics = consumers, producers, groups, topics
        self._clock = clock
        self._notify_enabled = notify_enabled
        self._filters = filters if filters is not None else FilterManager(sql92_enabled=True)
        self._client_ids = client_ids if client_ids is not None else ClientIdTable(0)
        self._refusals = RateLimitedLog(log, clock.monotonic_ms)

    def heart_beat(self, ctx: RequestContext, request: RemotingCommand) -> Answer:
        """Register the heartbeat's consumers and producers now; answered at once, or, when an
        SQL92 subscription is not compiled yet, once it was compiled off the loop. SYSTEM_BUSY
        (`TooManyClientIds`, nothing registered) past `max_client_ids_per_address`, or
        (`ConsumerGroupFull`, its other groups and producers registered) when a group it would
        join is full; refusals (and SQL92 subscriptions that do not compile) are logged at most 10
        lines per 10 s."""
        data = decode_body(HeartbeatData, request.body_bytes())
        if not data.client_id:
            raise SystemError_("heartbeat client_id must be a non-empty string")
        try:
            self._client_ids.admit(ctx.channel, data.client_id)
        except TooManyClientIds as exc:
            self._refusals.warning("heartbeat of client %s from %s refused: %s", data.client_id,
                                   ctx.channel.remote_address, exc.remark)
            raise
        now_ms = self._clock.monotonic_ms()
        ctx.channel.attributes["client_id"] = data.client_id
        uncompiled: list[tuple[str, Subscription]] = []
        full: list[ConsumerGroupFull] = []
        for consumer in data.consumer_data_set:
            require_group_name(consumer.group_name)
            consume_type = _enum(ConsumeType, consumer.consume_type, "consume_type")
            message_model = _enum(MessageModel, consumer.message_model, "message_model")
            consume_from_where = _enum(ConsumeFromWhere, consumer.consume_from_where, "consume_from_where")
            subscriptions = [to_subscription(s) for s in consumer.subscription_data_set]
            try:
                self._consumers.require_room(consumer.group_name, ctx.channel)
            except ConsumerGroupFull as exc:
                full.append(exc)
                continue
            uncompiled += self._register_sql(consumer.group_name, subscriptions)
            group_config = self._groups.find_or_create(consumer.group_name)
            if group_config.retry_queue_nums > 0:
                self._topics.ensure(retry_topic(consumer.group_name), group_config.retry_queue_nums)
            self._consumers.register_consumer(
                consumer.group_name, ClientChannelInfo(ctx.channel, data.client_id, now_ms), consume_type,
                message_model, consume_from_where, subscriptions,
                notify=self._notify_enabled(consumer.group_name))
        for producer in data.producer_data_set:
            remark = check_group(producer.group_name)
            if remark is not None:
                raise SystemError_(remark)
            self._producers.register(producer.group_name, ctx.channel, data.client_id, now_ms)
        if full:
            self._refusals.warning("heartbeat of client %s from %s refused by group %s: %s", data.client_id,
                                   ctx.channel.remote_address, full[0].group, full[0].remark)
            raise full[0]
        if uncompiled:
            return self._compile_then_answer(request, uncompiled)
        return request.response()

    def check_client_config(self, ctx: RequestContext, request: RemotingCommand) -> Answer:
        """CHECK_CLIENT_CONFIG (RocketMQ `ClientManageProcessor#checkClientConfig`): SUCCESS when the
        subscription can be served; SUBSCRIPTION_PARSE_FAILED (a `FilterSyntaxError` remark with line,
        column and a caret, or the bound an expression is over) when its expression does not
        compile; SYSTEM_ERROR for SQL92 when `filter_support_sql92` is off. An SQL92 expression
        not compiled yet is compiled off the loop first."""
        data = decode_body(CheckClientRequestBody, request.body_bytes())
        require_group_name(data.group)
        sub = data.subscription_data
        require_topic_name(sub.topic)
        if self._filters.pending(sub.expression_type, sub.sub_string):
            return self._check_compiled(request, sub.sub_string)
        self._filters.check(sub.expression_type, sub.sub_string)
        return request.response()

    async def _check_compiled(self, request: RemotingCommand, expression: str) -> RemotingCommand:
        await self._filters.compile_async(expression)
        return request.response()

    def _register_sql(self, group: str, subscriptions: list[Subscription]) -> list[tuple[str, Subscription]]:
        """Register a heartbeat's compiled SQL92 subscriptions, so the first pull finds them cached
        and they are indexed as messages arrive; returns those to compile first. A failure is only
        logged: the pulls of that subscription are refused with it."""
        uncompiled = []
        for sub in subscriptions:
            if sub.expression_type != ExpressionType.SQL92:
                continue
            try:
                self._filters.register(group, sub.topic, sub.sub_version, sub.sub_string, compile_now=False)
            except NotCompiled:
                uncompiled.append((group, sub))
            except ResponseError as exc:
                self._refusals.warning("group %s: SQL92 subscription to %s refused: %s", group, sub.topic, exc)
        return uncompiled

    async def _compile_then_answer(self, request: RemotingCommand,
                                   uncompiled: list[tuple[str, Subscription]]) -> RemotingCommand:
        for group, sub in uncompiled:
            try:
                await self._filters.compile_async(sub.sub_string)
            except ResponseError as exc:
                self._refusals.warning("group %s: SQL92 subscription to %s refused: %s", group, sub.topic, exc)
                continue
            self._register_sql(group, [sub])
        return request.response()

    def unregister_client(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = UnregisterClientRequestHeader.from_fields(request.fields)
        if header.producer_group:
            self._producers.unregister(header.producer_group, ctx.channel)
        if header.consumer_group:
            self._consumers.unregister_consumer(header.consumer_group, ctx.channel,
                                                notify=self._notify_enabled(header.consumer_group))
        return request.response()
