"""Request codes, response codes and flag bits of the wire protocol (PROTOCOL.md).

Numbers are Apache RocketMQ 4.9's, so traces read the same."""

from __future__ import annotations

from enum import IntEnum, IntFlag


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    RESET_CONSUMER_CLIENT_OFFSET = 220
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    GET_CONSUMER_RUNNING_INFO = 307
    SEND_BATCH_MESSAGE = 320
    # controller mode (RocketMQ 5's codes): brokers report to the controller, admins read it
    BROKER_HEARTBEAT = 904
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_GET_REPLICA_INFO = 1004
    # POP consumption (RocketMQ 5's codes)
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    NOTIFICATION = 200054
    BATCH_ACK_MESSAGE = 200151
    QUERY_MESSAGE_TRACE = 200900    # rocketq's: the broker-recorded trace of a message (docs/operations/trace.md)
    # users and ACLs (RocketMQ 5.3's ACL 2.0 codes)
    AUTH_CREATE_USER = 3001
    AUTH_UPDATE_USER = 3002
    AUTH_DELETE_USER = 3003
    AUTH_GET_USER = 3004
    AUTH_LIST_USER = 3005
    AUTH_CREATE_ACL = 3006
    AUTH_UPDATE_ACL = 3007
    AUTH_DELETE_ACL = 3008
    AUTH_GET_ACL = 3009
    AUTH_LIST_ACL = 3010
    # rocketq's own codes: 700000 + the RocketMQ code they extend (RocketMQ uses none above 200156)
    END_TRANSACTION_BATCH = 700037      # END_TRANSACTION (37) of many half messages in one request


class ResponseCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11    # SYNC_MASTER: fewer than in_sync_replicas_min replicas in sync
    FLUSH_SLAVE_TIMEOUT = 12    # SYNC_MASTER: the slaves did not have the send within the timeout
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    CONSUMER_NOT_ONLINE = 206
    NO_MESSAGE = 208            # POP: an ack or change whose receipt handle is no longer current
    FLOW_CONTROL = 215
    CONTROLLER_FENCED_MASTER_EPOCH = 2000   # an in-sync set change from a master that is no longer master
    CONTROLLER_NOT_LEADER = 2007            # ask the leader controller (its address in `leader_addr`)


class CommandFlag(IntFlag):
    """Bits of the header's `flag`."""

    RESPONSE = 0x1
    ONEWAY = 0x2


# Plain-int copies for hot paths: IntFlag arithmetic goes through enum machinery (microseconds).
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2


class PullSysFlag(IntFlag):
    """`sys_flag` bits of PULL_MESSAGE (RocketMQ `PullSysFlag`)."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL = 0x10


class Perm(IntFlag):
    """Topic permission bits (RocketMQ `PermName`)."""

    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8


PROTOCOL_VERSION = 1
