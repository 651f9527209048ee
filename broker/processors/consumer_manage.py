"""GET_CONSUMER_LIST_BY_GROUP, QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET (REFERENCE.md §7, §8)."""

from __future__ import annotations

from broker.offset.consumer_offset_manager import ConsumerOffsetManager
from broker.processors.validate import require_group_name, require_non_negative, require_topic_name
from broker.registry.consumer_manager import ConsumerManager
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.topics.topic_config_manager import TopicConfigManager
from protocol.bodies import ConsumerListBody, encode_body
from protocol.command import RemotingCommand
from protocol.errors import QueryNotFound, SystemError_
from protocol.headers import (
    ConsumerGroupRequestHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)


class ConsumerManageProcessor:
    def __init__(self, consumers: ConsumerManager, offsets: ConsumerOffsetManager, topics: TopicConfigManager,
                 store: MessageStore) -> None:
        self._consumers, self._offsets, self._topics, self._store = consumers, offsets, topics, store

    def get_consumer_list(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = ConsumerGroupRequestHeader.from_fields(request.fields)
        require_group_name(header.consumer_group)
        group = self._consumers.get(header.consumer_group)
        if group is None or not group.channels:
            raise SystemError_(f"no consumer of group {header.consumer_group!r} is online")
        return request.response(body=encode_body(ConsumerListBody(consumer_id_list=group.client_ids())))

    def query_consumer_offset(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """The committed offset; with none, 0 when the queue still starts at offset 0 and its first
        message is still "in memory" (RocketMQ answers 0 there, so a new group replays a young
        queue whatever its consume_from_where), else QUERY_NOT_FOUND."""
        header = QueryConsumerOffsetRequestHeader.from_fields(request.fields)
        require_group_name(header.consumer_group)
        require_topic_name(header.topic)
        self._topics.require_readable_queue(header.topic, header.queue_id)
        queue_offset = self._offsets.query(header.consumer_group, header.topic, header.queue_id)
        if queue_offset is None or queue_offset < 0:
            if (self._store.get_min_offset(header.topic, header.queue_id) > 0
                    or self._store.check_in_disk_by_consume_offset(header.topic, header.queue_id, 0)):
                raise QueryNotFound(f"no committed offset for {header.consumer_group!r} on "
                                    f"{header.topic}:{header.queue_id}")
            queue_offset = 0
        return request.response(header=OffsetResponseHeader(offset=queue_offset))

    def update_consumer_offset(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = UpdateConsumerOffsetRequestHeader.from_fields(request.fields)
        require_group_name(header.consumer_group)
        require_topic_name(header.topic)
        require_non_negative("commit_offset", header.commit_offset)
        self._topics.require_readable_queue(header.topic, header.queue_id)
        self._offsets.commit(ctx.client_addr, header.consumer_group, header.topic, header.queue_id,
                             header.commit_offset)
        return request.response()
