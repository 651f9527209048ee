"""Headers of the codes RocketMQ 5 added and rocketq took with it: users and ACLs (AUTH_*, the same
on brokers and name servers), transactions (END_TRANSACTION, CHECK_TRANSACTION_STATE) and POP
consumption (POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME,
NOTIFICATION). The base class, the typed integers and the rules are `protocol.headers`'."""

from __future__ import annotations

from protocol.headers import Header, Int32, Offset, Timestamp, header

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
class EndTransactionBatchRequestHeader(Header):
    """END_TRANSACTION_BATCH (700037, ours), producer → broker: END_TRANSACTION for each entry of
    the body (`protocol.transaction.encode_end_batch`), all of `producer_group`."""

    producer_group: str
    from_transaction_check: bool = False


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
