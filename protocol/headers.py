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


@header
class CreateSubscriptionGroupRequestHeader(Header):
    group_name: str
    consume_enable: bool = True
    retry_queue_nums: Int32 = 1
    retry_max_times: Int32 = 16
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False     # FIFO group (POP): RocketMQ 5 `consumeMessageOrderly`


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


# -- users and ACLs (AUTH_* codes, issue #37; the same on brokers and name servers) ---------------


@header
class CreateUserRequestHeader(Header):
    """AUTH_CREATE_USER: `signing_key` is 64 hex digits, `protocol.signing.signing_key(username,
    password)` computed by the admin client, so the password never travels."""

    username: str
    signing_key: str
    user_type: str = "Normal"       # "Super" or "Normal"


@header
class UpdateUserRequestHeader(Header):
    """AUTH_UPDATE_USER: a field left out (None) is left unchanged."""

    username: str
    signing_key: str | None = None
    user_type: str | None = None
    user_status: str | None = None  # "enable" or "disable"


@header
class UserRequestHeader(Header):
    """AUTH_DELETE_USER and AUTH_GET_USER: one user."""

    username: str


DeleteUserRequestHeader = GetUserRequestHeader = UserRequestHeader


@header
class ListUsersRequestHeader(Header):
    """AUTH_LIST_USER: users whose name contains `filter` (None: all)."""

    filter: str | None = None


@header
class DeleteAclRequestHeader(Header):
    """AUTH_DELETE_ACL: `resources` comma-separated resource patterns (None: the whole ACL)."""

    subject: str
    resources: str | None = None


@header
class GetAclRequestHeader(Header):
    subject: str


@header
class ListAclsRequestHeader(Header):
    """AUTH_LIST_ACL: subjects containing `subject_filter`, entries whose resource contains
    `resource_filter` (None: all)."""

    subject_filter: str | None = None
    resource_filter: str | None = None


@header
class EndTransactionRequestHeader(Header):
    """END_TRANSACTION (37), producer → broker (RocketMQ `EndTransactionRequestHeader`): resolve
    the half message at `commit_log_offset` / `tran_state_table_offset` (its queue offset in
    RMQ_SYS_TRANS_HALF_TOPIC) of `producer_group`. `commit_or_rollback`: 8 commit, 12 rollback,
    0 unknown (`protocol.transaction`). `topic` is the message's real topic (what authorization
    checks Pub on, as RocketMQ 5.3's header)."""

    producer_group: str
    topic: str
    tran_state_table_offset: Offset
    commit_log_offset: Offset
    commit_or_rollback: Int32
    from_transaction_check: bool = False
    msg_id: str | None = None
    transaction_id: str | None = None


@header
class CheckTransactionStateRequestHeader(Header):
    """CHECK_TRANSACTION_STATE (39), broker → producer, one-way (RocketMQ
    `CheckTransactionStateRequestHeader`); the body is the half message as a stored array (its real
    topic and queue), as a pull body carries it."""

    producer_group: str
    topic: str
    tran_state_table_offset: Offset
    commit_log_offset: Offset
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None
    broker_name: str = ""


# -- POP consumption (RocketMQ 5's PopMessageRequestHeader & co., fields in snake_case) -------------

@header
class PopMessageRequestHeader(Header):
    """POP_MESSAGE: up to `max_msg_nums` (1..32) messages of `topic` for `consumer_group`, from
    `queue_id` (-1: any readable queue, the broker picks), each invisible to other pops for
    `invisible_time` ms; held up to `poll_time` ms when nothing is visible. `init_mode` 0 starts a
    new group's queue at its min offset, 1 at its max (RocketMQ `ConsumeInitMode` MIN/MAX).
    `exp_type`/`exp`: a TAG expression (None or "*": all). `order`: FIFO delivery."""

    consumer_group: str
    topic: str
    queue_id: Int32 = -1
    max_msg_nums: Int32 = 32
    invisible_time: int = 60_000
    poll_time: int = 0
    born_time: Timestamp = 0
    init_mode: Int32 = 0
    exp_type: str | None = None
    exp: str | None = None
    order: bool = False


@header
class AckMessageRequestHeader(Header):
    """ACK_MESSAGE: acknowledge the popped message at queue offset `offset` of (`topic`,
    `queue_id`) for `consumer_group`; `extra_info` is its receipt handle."""

    consumer_group: str
    topic: str
    queue_id: Int32
    extra_info: str
    offset: Offset


@header
class BatchAckMessageRequestHeader(Header):
    """BATCH_ACK_MESSAGE (RocketMQ 5's 200151): acks of several messages of one (`consumer_group`,
    `topic`); the body is a `BatchAckBody`."""

    consumer_group: str
    topic: str


@header
class ChangeInvisibleTimeRequestHeader(Header):
    """CHANGE_MESSAGE_INVISIBLETIME: an `AckMessageRequestHeader` plus the new `invisible_time`
    (ms from now)."""

    consumer_group: str
    topic: str
    queue_id: Int32
    extra_info: str
    offset: Offset
    invisible_time: int


@header
class ChangeInvisibleTimeResponseHeader(Header):
    """`extra_info`: the new receipt handle (the old one is stale from now on)."""

    extra_info: str
    pop_time: int
    invisible_time: int
    revive_qid: int = 0


@header
class NotificationRequestHeader(Header):
    """NOTIFICATION: is a message visible for `consumer_group` on `topic` (`queue_id` -1: any)?
    Held up to `poll_time` ms while not. Pops nothing."""

    consumer_group: str
    topic: str
    queue_id: Int32 = -1
    poll_time: int = 0
    born_time: Timestamp = 0
    order: bool = False


@header
class NotificationResponseHeader(Header):
    has_msg: bool
