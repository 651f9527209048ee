"""The rocketq asyncio client: `Producer`, `PushConsumer`, `PullConsumer`, `SimpleConsumer` (POP), their values and the
errors they raise (all `MQError`s: a broker's answer is a `ResponseError` such as
`SubscriptionParseFailed` or `TopicNotExist`; an unreachable peer `ConnectionClosed` or
`RequestTimeout`; a refusal by a broker with authentication on `NoPermission`). `Credentials`
(access key, secret key) is what `credentials=` of each client takes."""

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
from client.consumer.message_view import MessageView
from client.consumer.pull_consumer import PullConsumer
from client.consumer.push_consumer import PushConsumer
from client.consumer.simple_consumer import SimpleConsumer
from client.errors import ClientStateError
from client.producer.producer import Producer
from client.producer.selector import SelectMessageQueueByHash, SelectMessageQueueByRandom
from client.producer.transaction_producer import TransactionListener, TransactionProducer, TransactionSendResult
from protocol.errors import (
    ConnectionClosed,
    FlushDiskTimeout,
    FlushSlaveTimeout,
    MQError,
    NoPermission,
    ReceiptHandleExpired,
    RequestTimeout,
    ResponseError,
    SlaveNotAvailable,
    SubscriptionParseFailed,
    TopicNotExist,
)
from protocol.message import Message, MessageExt
from protocol.model import ConsumeFromWhere, MessageModel, MessageQueue
from protocol.signing import Credentials
from protocol.transaction import LocalTransactionState

__all__ = [
    "AllocateMachineRoomNearby", "AllocateMessageQueueAveragely", "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueByConfig", "AllocateMessageQueueByMachineRoom", "AllocateMessageQueueConsistentHash",
    "ClientStateError", "ConnectionClosed", "ConsumeConcurrentlyContext", "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere", "ConsumeOrderlyContext", "ConsumeOrderlyStatus", "Credentials", "FlushDiskTimeout",
    "FlushSlaveTimeout",
    "LocalTransactionState", "MQError", "Message", "MessageExt", "MessageModel", "MessageQueue",
    "MessageSelector", "MessageView", "NoPermission", "Producer", "PullConsumer", "PullResult", "PushConsumer",
    "ReceiptHandleExpired", "RequestTimeout", "ResponseError", "SelectMessageQueueByHash",
    "SelectMessageQueueByRandom", "SendResult", "SendStatus", "SimpleConsumer", "SlaveNotAvailable",
    "SubscriptionParseFailed",
    "TopicNotExist", "TransactionListener", "TransactionProducer", "TransactionSendResult",
]
