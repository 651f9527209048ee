"""Listener results and contexts (RocketMQ `ConsumeConcurrentlyStatus`, `ConsumeConcurrentlyContext`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

from protocol.message import MessageExt
from protocol.model import MessageQueue


class ConsumeConcurrentlyStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


@dataclass(slots=True)
class ConsumeConcurrentlyContext:
    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0
    ack_index: int = 2**31 - 1


ListenerResult = ConsumeConcurrentlyStatus | None
MessageListener = Callable[[list[MessageExt], ConsumeConcurrentlyContext],
                           ListenerResult | Awaitable[ListenerResult]]
