"""Typed request/response headers (the `ext` map of PROTOCOL.md's table), one class per code.

Every header is a frozen, slotted, kw-only dataclass; `from_fields` checks types (a bool or float is
not an int) and raises `MissingHeaderField` naming the field; `to_fields` gives the `ext` map.

Integers are range-checked at decode: a plain `int` within signed 64 bits (Java's long), the
annotated ones within their `IntRange` (`QueueId` 0..1023, as topics have at most 1,024 queues;
`Int32` for Java's int fields: flags, counts, levels, durations; `NonNegativeInt32` for
`reconsume_times`; `Offset` and `Timestamp` 0..2**63-1). Out of range raises `FieldOutOfRange`
(SYSTEM_ERROR, as any mistyped field), or the header's `out_of_range` error: MESSAGE_ILLEGAL for
SEND_MESSAGE and SEND_BATCH_MESSAGE, as RocketMQ's `msgCheck` answers a bad message.
CONSUMER_SEND_MSG_BACK keeps SYSTEM_ERROR for every bad field, a negative offset included, as
RocketMQ answers a send-back whose offset finds no message."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar, Self, TypeVar, dataclass_transform

from protocol.errors import FieldOutOfRange, MessageIllegal, ResponseError
from protocol.typed import IntRange, from_value

_H = TypeVar("_H")
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
MAX_QUEUE_ID = 1023                 # topics have 1..1024 queues (TopicConfigManager)
QueueId = Annotated[int, IntRange(0, MAX_QUEUE_ID)]
Int32 = Annotated[int, IntRange(INT32_MIN, INT32_MAX)]
NonNegativeInt32 = Annotated[int, IntRange(0, INT32_MAX)]
Offset = Annotated[int, IntRange(0, INT64_MAX)]         # a queue or commit-log offset
Timestamp = Annotated[int, IntRange(0, INT64_MAX)]      # epoch ms


class Header:
    __slots__ = ()
    out_of_range: ClassVar[type[ResponseError] | None] = None   # None: FieldOutOfRange (MESSAGE_ILLEGAL)

    @classmethod
    def from_fields(cls, ext: dict[str, Any]) -> Self:
        """The header of a request's `ext` map; raises `MissingHeaderField` (a missing or mistyped
        field), `FieldOutOfRange` or the class's `out_of_range` error (an integer out of range)."""
        try:
            return from_value(cls, ext)
        except FieldOutOfRange as exc:
            if cls.out_of_range is None:
                raise
            raise cls.out_of_range(exc.remark) from None

    def to_fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELD_NAMES[type(self)]}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}   # per header class, filled once by `header`


@dataclass_transform(frozen_default=True, kw_only_default=True)
def header(cls: type[_H]) -> type[_H]:
    """`@dataclass(frozen=True, slots=True, kw_only=True)`, spelled so type checkers see a dataclass."""
    made = dataclass(frozen=True, slots=True, kw_only=True)(cls)
    _FIELD_NAMES[made] = tuple(f.name for f in fields(made))  # type: ignore[arg-type]
    return made


@header
class SendMessageRequestHeader(Header):
    out_of_range: ClassVar[type[ResponseError] | None] = MessageIllegal
    producer_group: str
    topic: str
    queue_id: QueueId
    flag: Int32 = 0
    born_timestamp: Timestamp = 0
    properties: dict[str, str]
    reconsume_times: NonNegativeInt32 = 0
    max_reconsume_times: Int32 | None = None       # < 0: the group's retry_max_times


@header
class SendMessageResponseHeader(Header):
    msg_id: str
    queue_id: int
    queue_offset: int


@header
class SendBatchMessageRequestHeader(Header):
    out_of_range: ClassVar[type[ResponseError] | None] = MessageIllegal
    producer_group: str
    topic: str
    queue_id: QueueId
    born_timestamp: Timestamp = 0


@header
class SendBatchMessageResponseHeader(Header):
    msg_ids: list[str]
    queue_id: int
    queue_offset: int


@header
class PullMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: QueueId
    queue_offset: Offset
    max_msg_nums: Int32
    sys_flag: Int32
    commit_offset: int             # checked ≥ 0 only with the COMMIT_OFFSET flag
    suspend_timeout_ms: Int32
    sub_version: int
    subscription: str | None = None
    expression_type: str | None = None


@header
class PullMessageResponseHeader(Header):
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int = 0


@header
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: QueueId


@header
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: QueueId
    commit_offset: int


@header
class TopicQueueRequestHeader(Header):
    """GET_MAX_OFFSET, GET_MIN_OFFSET and GET_EARLIEST_MSG_STORETIME: one queue of a topic."""

    topic: str
    queue_id: QueueId


GetMaxOffsetRequestHeader = GetMinOffsetRequestHeader = TopicQueueRequestHeader
GetEarliestMsgStoretimeRequestHeader = TopicQueueRequestHeader


@header
class SearchOffsetRequestHeader(Header):
    topic: str
    queue_id: QueueId
    timestamp: int


@header
class OffsetResponseHeader(Header):
    """QUERY_CONSUMER_OFFSET, GET_MAX/MIN_OFFSET and SEARCH_OFFSET_BY_TIMESTAMP answer `offset`."""

    offset: int


@header
class GetEarliestMsgStoretimeResponseHeader(Header):
    timestamp: int


@header
class ViewMessageByIdRequestHeader(Header):
    msg_id: str


@header
class UnregisterClientRequestHeader(Header):
    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None


@header
class ConsumerSendMsgBackRequestHeader(Header):
    commit_log_offset: Offset
    group: str
    delay_level: Int32 = 0
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    max_reconsume_times: Int32 | None = None


@header
class ConsumerGroupRequestHeader(Header):
    """GET_CONSUMER_LIST_BY_GROUP, NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_CONNECTION_LIST."""

    consumer_group: str


GetConsumerListByGroupRequestHeader = NotifyConsumerIdsChangedRequestHeader = ConsumerGroupRequestHeader


@header
class CreateTopicRequestHeader(Header):
    topic: str
    read_queue_nums: Int32
    write_queue_nums: Int32
    perm: Int32 = 6


@header
class GetRouteInfoRequestHeader(Header):
    topic: str


MAX_BROKER_ID = 1_000_000     # broker ids a group may send pulls to (slave_read_enable)


@header
class CreateSubscriptionGroupRequestHeader(Header):
    group_name: str
    consume_enable: bool = True
    retry_queue_nums: Int32 = 1
    retry_max_times: Int32 = 16
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False     # FIFO group (POP): RocketMQ 5 `consumeMessageOrderly`
    broker_id: Int32 = 0                      # slave_read_enable: pulls in memory go to this broker id
    which_broker_when_consume_slowly: Int32 = 1   # ... and pulls far behind to this one (a slave)


@header
class GetConsumeStatsRequestHeader(Header):
    consumer_group: str
    topic: str | None = None


@header
class RegisterBrokerRequestHeader(Header):
    """REGISTER_BROKER / UNREGISTER_BROKER: who the broker is; REGISTER's body is a
    `RegisterBrokerBody` with its topic configs."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int = 0
    ha_server_addr: str = ""      # a master's "host:ha_listen_port" its slaves replicate from (haServerAddr)
    grpc_addr: str = ""           # "host:grpc_port" of its RocketMQ 5 gRPC API ("": not served)


@header
class RegisterBrokerResponseHeader(Header):
    """REGISTER_BROKER's answer (RocketMQ `RegisterBrokerResponseHeader`): the replica set's master
    address and its HA address as last registered ("" while no master is registered), which is how
    a slave finds its master."""

    master_addr: str = ""
    ha_server_addr: str = ""


@header
class TopicRequestHeader(Header):
    """DELETE_TOPIC_IN_BROKER and GET_TOPIC_STATS_INFO: one topic."""

    topic: str


DeleteTopicRequestHeader = GetTopicStatsInfoRequestHeader = TopicRequestHeader


@header
class DeleteSubscriptionGroupRequestHeader(Header):
    group_name: str
    clean_offset: bool = True      # also forget the group's committed offsets


@header
class QueryMessageRequestHeader(Header):
    """QUERY_MESSAGE: messages of `topic` whose KEYS (or UNIQ_KEY) include `key`, newest first, at most
    `max_num`, stored within [begin_timestamp, end_timestamp] (epoch ms; end 0 = no upper bound)."""

    topic: str
    key: str
    max_num: Int32 = 32
    begin_timestamp: int = 0
    end_timestamp: int = 0


@header
class GetConsumerRunningInfoRequestHeader(Header):
    """GET_CONSUMER_RUNNING_INFO: admin → broker, which forwards it to the client's connection."""

    consumer_group: str
    client_id: str
    jstack_enable: bool = False


@header
class ResetOffsetRequestHeader(Header):
    """INVOKE_BROKER_TO_RESET_OFFSET (admin → broker). Exactly one target: `timestamp` ≥ 0 (epoch ms;
    each queue moves to the offset `SEARCH_OFFSET_BY_TIMESTAMP` gives), `to_where` "EARLIEST" or
    "LATEST" (rocketq: the queue's min or max offset), or `queue_id` ≥ 0 with `offset` ≥ 0 (that
    queue only, RocketMQ 5's fields)."""

    topic: str
    group: str
    timestamp: int = -1
    is_force: bool = True
    queue_id: Annotated[int, IntRange(-1, MAX_QUEUE_ID)] = -1
    offset: int = -1
    to_where: str | None = None


@header
class ResetConsumerClientOffsetRequestHeader(Header):
    """RESET_CONSUMER_CLIENT_OFFSET (broker → client); body `ResetOffsetBody` (the `after` offsets)."""

    topic: str
    group: str
    timestamp: int = -1
