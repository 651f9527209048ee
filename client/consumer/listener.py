"""Listener results and contexts (RocketMQ `ConsumeConcurrentlyStatus`, `ConsumeConcurrentlyContext`,
`ConsumeOrderlyStatus`, `ConsumeOrderlyContext`)."""

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


class ConsumeOrderlyStatus(Enum):
    """What an orderly listener answers (RocketMQ `ConsumeOrderlyStatus`). With `auto_commit`
    (the default) only SUCCESS and SUSPEND_CURRENT_QUEUE_A_MOMENT matter: COMMIT and ROLLBACK are
    taken as SUCCESS, as RocketMQ does; without it, COMMIT stores the offset and ROLLBACK puts the
    messages back."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"


@dataclass(slots=True)
class ConsumeOrderlyContext:
    """Given with each orderly listener call. The listener may set `auto_commit` (False: the offset
    moves only on COMMIT) and `suspend_current_queue_time_ms` (-1: the consumer's
    `suspend_current_queue_time_ms`; clamped to 10..30,000 ms) for this call's result."""

    message_queue: MessageQueue
    auto_commit: bool = True
    suspend_current_queue_time_ms: int = -1


OrderlyListenerResult = ConsumeOrderlyStatus | None
OrderlyMessageListener = Callable[[list[MessageExt], ConsumeOrderlyContext],
                                  OrderlyListenerResult | Awaitable[OrderlyListenerResult]]
