"""Admin requests on topic and subscription-group configs (RocketMQ `AdminBrokerProcessor`):
GET_ALL_TOPIC_CONFIG, DELETE_TOPIC_IN_BROKER, GET_TOPIC_STATS_INFO, GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
DELETE_SUBSCRIPTIONGROUP.

Deleting a topic removes its config and every group's offsets on it; the stored messages stay until
the commit log is cleaned (RocketMQ also deletes the consume-queue files at once; we leave the
store to retention, so a topic created again with the same name continues its queue offsets)."""

from __future__ import annotations

from broker.offset.consumer_offset_manager import ConsumerOffsetManager
from broker.processors.validate import require_group_name, require_topic_name
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.system_topics import SystemTopics
from broker.topics.topic_config_manager import TopicConfigManager
from protocol.bodies import (
    SubscriptionGroupData,
    SubscriptionGroupTable,
    TopicConfigData,
    TopicConfigTable,
    TopicQueueStats,
    TopicStatsTable,
    encode_body,
)
from protocol.command import RemotingCommand
from protocol.errors import SubscriptionGroupNotExist, TopicNotExist
from protocol.headers import DeleteSubscriptionGroupRequestHeader, TopicRequestHeader


class TopicGroupAdminProcessor:
    def __init__(self, store: MessageStore, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 offsets: ConsumerOffsetManager, broker_name: str, system_topics: SystemTopics) -> None:
        self._store, self._topics, self._groups, self._offsets = store, topics, groups, offsets
        self._system_topics = system_topics
        self._broker_name = broker_name

    async def get_all_topic_config(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        table = [TopicConfigData(topic=c.topic, read_queue_nums=c.read_queue_nums,
                                 write_queue_nums=c.write_queue_nums, perm=c.perm)
                 for c in sorted(self._topics.topics(), key=lambda c: c.topic)]
        return request.response(body=encode_body(TopicConfigTable(topic_config_table=table)))

    async def delete_topic(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """TOPIC_NOT_EXIST when there is no such topic; NO_PERMISSION for a system topic. Answered
        once `config/topics.json` no longer holds it."""
        header = TopicRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        self._system_topics.require_admin_may_change(header.topic, "delete")
        if not self._topics.delete(header.topic):
            raise TopicNotExist(header.topic)
        self._offsets.remove_topic(header.topic)
        await self._topics.wait_durable(header.topic)
        return request.response()

    async def get_topic_stats_info(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """Per queue: min and max offset and the store time of the last message."""
        header = TopicRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        config = self._topics.require(header.topic)
        store, stats = self._store, []
        for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
            max_offset = store.get_max_offset(header.topic, queue_id)
            last = store.get_store_time(header.topic, queue_id, max_offset - 1) if max_offset > 0 else None
            stats.append(TopicQueueStats(broker_name=self._broker_name, queue_id=queue_id,
                                         min_offset=store.get_min_offset(header.topic, queue_id),
                                         max_offset=max_offset, last_update_timestamp=last or 0))
        return request.response(body=encode_body(TopicStatsTable(offset_table=stats)))

    async def get_all_subscription_group_config(self, ctx: RequestContext,
                                                request: RemotingCommand) -> RemotingCommand:
        table = [SubscriptionGroupData(group_name=g.group_name, consume_enable=g.consume_enable,
                                       consume_broadcast_enable=g.consume_broadcast_enable,
                                       retry_queue_nums=g.retry_queue_nums, retry_max_times=g.retry_max_times,
                                       consume_message_orderly=g.consume_message_orderly, broker_id=g.broker_id,
                                       which_broker_when_consume_slowly=g.which_broker_when_consume_slowly)
                 for g in self._groups.groups()]
        return request.response(body=encode_body(SubscriptionGroupTable(subscription_group_table=table)))

    async def delete_subscription_group(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """SUBSCRIPTION_GROUP_NOT_EXIST when there is no such group; `clean_offset` also forgets
        the group's committed offsets (RocketMQ `cleanOffset`)."""
        header = DeleteSubscriptionGroupRequestHeader.from_fields(request.fields)
        require_group_name(header.group_name)
        if not self._groups.delete(header.group_name):
            raise SubscriptionGroupNotExist(f"subscription group {header.group_name!r} does not exist")
        if header.clean_offset:
            self._offsets.remove_group(header.group_name)
        await self._groups.wait_durable(header.group_name)
        return request.response()
