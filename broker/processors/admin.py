"""Queue bounds, time search, message lookup, topic/group creation and routes (§2.2, §8, §15)."""

from __future__ import annotations

from broker.processors.validate import require_topic_name
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.topics.subscription_group_manager import SubscriptionGroupConfig, SubscriptionGroupManager
from broker.topics.system_topics import SystemTopics
from broker.topics.topic_config_manager import TopicConfig, TopicConfigManager
from protocol.bodies import BrokerData, ClusterInfo, QueueData, TopicRouteData, encode_body
from protocol.command import RemotingCommand
from protocol.errors import QueryNotFound, SystemError_
from protocol.headers import (
    CreateSubscriptionGroupRequestHeader,
    CreateTopicRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetRouteInfoRequestHeader,
    OffsetResponseHeader,
    SearchOffsetRequestHeader,
    TopicQueueRequestHeader,
    ViewMessageByIdRequestHeader,
)
from protocol.message import parse_msg_id


class AdminProcessor:
    def __init__(self, store: MessageStore, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 broker_name: str, cluster_name: str, advertised_address: str,
                 system_topics: SystemTopics) -> None:
        self._store, self._topics, self._groups = store, topics, groups
        self._system_topics = system_topics
        self._broker_name, self._cluster_name = broker_name, cluster_name
        self._address = advertised_address

    def _queue(self, request: RemotingCommand) -> TopicQueueRequestHeader:
        header = TopicQueueRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        self._topics.require_readable_queue(header.topic, header.queue_id)
        return header

    def get_max_offset(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        h = self._queue(request)
        return request.response(header=OffsetResponseHeader(offset=self._store.get_max_offset(h.topic, h.queue_id)))

    def get_min_offset(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        h = self._queue(request)
        return request.response(header=OffsetResponseHeader(offset=self._store.get_min_offset(h.topic, h.queue_id)))

    def get_earliest_msg_storetime(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        h = self._queue(request)
        timestamp = self._store.get_earliest_msg_store_time(h.topic, h.queue_id)
        return request.response(header=GetEarliestMsgStoretimeResponseHeader(timestamp=timestamp))

    def search_offset_by_timestamp(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = SearchOffsetRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        self._topics.require_readable_queue(header.topic, header.queue_id)
        queue_offset = self._store.search_offset_by_timestamp(header.topic, header.queue_id, header.timestamp)
        return request.response(header=OffsetResponseHeader(offset=queue_offset))

    def view_message_by_id(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = ViewMessageByIdRequestHeader.from_fields(request.fields)
        try:
            _, commit_log_offset = parse_msg_id(header.msg_id)
        except ValueError as exc:
            raise SystemError_(f"malformed msg_id {header.msg_id!r}: {exc}") from None
        payload = self._store.look_message_by_offset(commit_log_offset)
        if payload is None:
            raise QueryNotFound(f"no message with id {header.msg_id}")
        return request.response(body=payload)

    async def update_and_create_topic(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """Create or change a topic; answered once `config/topics.json` holds the change (a write in a
        worker thread, shared with concurrent changes). NO_PERMISSION for a system topic;
        SERVICE_NOT_AVAILABLE when the file cannot be written (the change stays in memory)."""
        header = CreateTopicRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        self._system_topics.require_admin_may_change(header.topic, "create or update")
        if not 0 <= header.perm <= 15:
            raise SystemError_(f"perm {header.perm} is not a combination of PRIORITY 8, READ 4, WRITE 2, INHERIT 1")
        self._topics.update(TopicConfig(topic=header.topic, read_queue_nums=header.read_queue_nums,
                                        write_queue_nums=header.write_queue_nums, perm=header.perm))
        await self._topics.wait_durable(header.topic)
        return request.response()

    def get_route_info(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = GetRouteInfoRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        config = self._topics.require(header.topic)
        route = TopicRouteData(
            queue_datas=[QueueData(broker_name=self._broker_name, read_queue_nums=config.read_queue_nums,
                                   write_queue_nums=config.write_queue_nums, perm=config.perm)],
            broker_datas=[BrokerData(cluster=self._cluster_name, broker_name=self._broker_name,
                                     broker_addrs={0: self._address})])
        return request.response(body=encode_body(route))

    def get_broker_cluster_info(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """GET_BROKER_CLUSTER_INFO answered for this broker alone (a name server answers for its
        whole cluster), so clients find brokers the same way with or without name servers."""
        broker = BrokerData(cluster=self._cluster_name, broker_name=self._broker_name,
                            broker_addrs={0: self._address})
        info = ClusterInfo(broker_addr_table={self._broker_name: broker},
                           cluster_addr_table={self._cluster_name: [self._broker_name]})
        return request.response(body=encode_body(info))

    async def update_and_create_subscription_group(self, ctx: RequestContext,
                                                   request: RemotingCommand) -> RemotingCommand:
        """Create or change a group; answered once `config/subscription_groups.json` holds it."""
        header = CreateSubscriptionGroupRequestHeader.from_fields(request.fields)
        self._groups.update(SubscriptionGroupConfig(
            group_name=header.group_name, consume_enable=header.consume_enable,
            consume_broadcast_enable=header.consume_broadcast_enable,
            retry_queue_nums=header.retry_queue_nums, retry_max_times=header.retry_max_times,
            consume_message_orderly=header.consume_message_orderly, broker_id=header.broker_id,
            which_broker_when_consume_slowly=header.which_broker_when_consume_slowly))
        await self._groups.wait_durable(header.group_name)
        return request.response()
