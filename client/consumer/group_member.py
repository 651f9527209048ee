"""`GroupMember`: what a push and a pull consumer share as members of a consumer group: the
settings every consumer takes (group, endpoints, message model, where to start, the allocation
strategy), its subscriptions, and the answers the client instance asks of it (`MemberConsumer`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import ClassVar

from client.consumer.allocate import AllocateMessageQueueAveragely, AllocateMessageQueueStrategy
from client.consumer.pull_service import TopicSubscription, consumer_data
from client.instance import parse_endpoints
from protocol.bodies import ConsumerData
from protocol.model import ConsumeFromWhere, ConsumeType, MessageModel


class GroupMember:
    """A consumer of a group; the subclass names its `consume_type` and calls `_init_member` in its
    `__init__`."""

    consume_type: ClassVar[ConsumeType]

    def _init_member(self, consumer_group: str, endpoints: str | Sequence[str], message_model: str | MessageModel,
                     consume_from_where: str | ConsumeFromWhere,
                     allocate_strategy: AllocateMessageQueueStrategy | None) -> None:
        """The shared settings (the subclass checks the group name first, `check_group`); raises
        `ValueError` for bad endpoints, message model or consume-from-where."""
        self.consumer_group = consumer_group
        self.endpoints = parse_endpoints(endpoints)
        self.message_model = MessageModel(message_model)
        self.consume_from_where = ConsumeFromWhere(consume_from_where)
        self.allocate_strategy = allocate_strategy or AllocateMessageQueueAveragely()
        self._subscriptions: dict[str, TopicSubscription] = {}
        self._rebalance_lock = asyncio.Lock()       # one rebalance at a time

    def consumer_data(self) -> ConsumerData:
        """This consumer's entry in a heartbeat."""
        return consumer_data(self.consumer_group, self.consume_type, self.message_model, self.consume_from_where,
                             self._subscriptions.values())

    def subscribed_topics(self) -> list[str]:
        return list(self._subscriptions)
