"""The rocketq asyncio client: `Producer`, `PushConsumer`, `PullConsumer` and their values."""

from client.api import PullResult, SendResult, SendStatus
from client.consumer.allocate import (
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueByConfig,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
)
from client.consumer.listener import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
)
from client.consumer.message_selector import MessageSelector
from client.consumer.pull_consumer import PullConsumer
from client.consumer.push_consumer import PushConsumer
from client.producer.producer import Producer
from client.producer.selector import SelectMessageQueueByHash, SelectMessageQueueByRandom
from protocol.message import Message, MessageExt
from protocol.model import ConsumeFromWhere, MessageModel, MessageQueue

__all__ = [
    "AllocateMachineRoomNearby", "AllocateMessageQueueAveragely", "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueByConfig", "AllocateMessageQueueByMachineRoom", "AllocateMessageQueueConsistentHash",
    "ConsumeConcurrentlyContext", "ConsumeConcurrentlyStatus", "ConsumeFromWhere", "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus", "Message", "MessageExt",
    "MessageModel", "MessageQueue", "MessageSelector", "Producer", "PullConsumer", "PullResult", "PushConsumer",
    "SelectMessageQueueByHash", "SelectMessageQueueByRandom", "SendResult", "SendStatus",
]
