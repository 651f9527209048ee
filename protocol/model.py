"""Value types both sides share: queues, consumption models and pull statuses."""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import NamedTuple


class MessageQueue(NamedTuple):
    """One queue of a topic on one broker; ordered by topic, broker name, queue id (as RocketMQ's
    `MessageQueue.compareTo`)."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        # RocketMQ's MessageQueue.toString(); the consistent-hash strategy hashes this string.
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


class MessageModel(StrEnum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeType(StrEnum):
    PUSH = "PUSH"
    PULL = "PULL"
    POP = "POP"             # RocketMQ 5 CONSUME_POP: a SimpleConsumer


class ConsumeFromWhere(StrEnum):
    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class ExpressionType(StrEnum):
    TAG = "TAG"
    SQL92 = "SQL92"


class PullStatus(Enum):
    """Client-side result of a pull (RocketMQ `PullStatus`)."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"
