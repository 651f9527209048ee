"""One valid request per request code a broker handles (each would read or change something if it
were let through), and a snapshot of everything a request could change, for the refusal tests."""

from __future__ import annotations

from typing import Any

from broker.broker import Broker
from protocol.bodies import (
    AclEntryData,
    AclInfo,
    CheckClientRequestBody,
    ConsumerData,
    HeartbeatData,
    LockBatchBody,
    SubscriptionData,
    encode_batch_ack,
    encode_body,
)
from protocol.codes import PullSysFlag, RequestCode
from protocol.command import RemotingCommand, request
from protocol.headers import (
    ConsumerGroupRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    CreateSubscriptionGroupRequestHeader,
    CreateTopicRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumeStatsRequestHeader,
    GetRouteInfoRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    ResetOffsetRequestHeader,
    SearchOffsetRequestHeader,
    SendBatchMessageRequestHeader,
    SendMessageRequestHeader,
    TopicQueueRequestHeader,
    TopicRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageByIdRequestHeader,
)
from protocol.headers_v5 import (
    AckMessageRequestHeader,
    BatchAckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    CreateUserRequestHeader,
    DeleteAclRequestHeader,
    EndTransactionBatchRequestHeader,
    EndTransactionRequestHeader,
    GetAclRequestHeader,
    ListAclsRequestHeader,
    ListUsersRequestHeader,
    NotificationRequestHeader,
    PopMessageRequestHeader,
    UpdateUserRequestHeader,
    UserRequestHeader,
)
from protocol.message import Message, encode_batch_body
from protocol.signing import signing_key
from protocol.trace import QueryMessageTraceRequestHeader
from protocol.transaction import encode_end_batch
from tests.helpers import pull_header

TOPIC, GROUP = "t", "g"


def broker_requests(broker: Broker, msg_id: str, commit_log_offset: int) -> dict[int, RemotingCommand]:
    """Request code → a fresh, valid request of that code about topic `t`, group `g` and user
    `alice` (what the test set up)."""
    mq = [(TOPIC, broker.config.broker_name, 0)]
    code = RequestCode

    def acl(resource: str) -> bytes:
        return encode_body(AclInfo(subject="User:alice", entries=[AclEntryData(resource=resource, actions=["Pub"])]))

    def heartbeat() -> bytes:
        return encode_body(HeartbeatData(client_id="intruder", consumer_data_set=[ConsumerData(
            group_name="g2", subscription_data_set=[SubscriptionData(topic=TOPIC)])]))

    def lock(client_id: str) -> bytes:
        return encode_body(LockBatchBody(consumer_group=GROUP, client_id=client_id, mq_set=mq))
    check_client = encode_body(CheckClientRequestBody(client_id="intruder", group=GROUP, subscription_data=(
        SubscriptionData(topic=TOPIC, sub_string="a > 1", expression_type="SQL92"))))
    queue = TopicQueueRequestHeader(topic=TOPIC, queue_id=0)
    consumer_group = ConsumerGroupRequestHeader(consumer_group=GROUP)
    handle = f"1 0 60000 0 0 {broker.config.broker_name} 0 0"      # a receipt handle of the form a pop gives
    requests = [
        request(code.SEND_MESSAGE, SendMessageRequestHeader(producer_group="pg", topic=TOPIC, queue_id=0,
                                                            properties={}), b"x"),
        request(code.SEND_BATCH_MESSAGE, SendBatchMessageRequestHeader(producer_group="pg", topic=TOPIC, queue_id=0),
                encode_batch_body([Message(topic=TOPIC, body=b"y")] * 2)),
        request(code.PULL_MESSAGE, pull_header(topic=TOPIC, group=GROUP, commit_offset=1,
                                               sys_flag=PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET)),
        request(code.QUERY_CONSUMER_OFFSET, QueryConsumerOffsetRequestHeader(consumer_group=GROUP, topic=TOPIC,
                                                                             queue_id=0)),
        request(code.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader(consumer_group=GROUP, topic=TOPIC,
                                                                               queue_id=0, commit_offset=1)),
        request(code.CONSUMER_SEND_MSG_BACK, ConsumerSendMsgBackRequestHeader(
            commit_log_offset=commit_log_offset, group=GROUP, origin_msg_id=msg_id, origin_topic=TOPIC)),
        request(code.END_TRANSACTION, EndTransactionRequestHeader(
            producer_group="pg", topic=TOPIC, tran_state_table_offset=0, commit_log_offset=commit_log_offset,
            commit_or_rollback=8)),
        request(code.END_TRANSACTION_BATCH, EndTransactionBatchRequestHeader(producer_group="pg"),
                encode_end_batch([(TOPIC, 0, commit_log_offset, 8, "")])),
        request(code.GET_CONSUMER_LIST_BY_GROUP, consumer_group),
        request(code.POP_MESSAGE, PopMessageRequestHeader(consumer_group=GROUP, topic=TOPIC, queue_id=0,
                                                          max_msg_nums=1, invisible_time=60_000)),
        request(code.ACK_MESSAGE, AckMessageRequestHeader(consumer_group=GROUP, topic=TOPIC, queue_id=0,
                                                          extra_info=handle, offset=0)),
        request(code.BATCH_ACK_MESSAGE, BatchAckMessageRequestHeader(consumer_group=GROUP, topic=TOPIC),
                encode_batch_ack([(0, handle, 0)])),
        request(code.CHANGE_MESSAGE_INVISIBLETIME, ChangeInvisibleTimeRequestHeader(
            consumer_group=GROUP, topic=TOPIC, queue_id=0, extra_info=handle, offset=0, invisible_time=60_000)),
        request(code.NOTIFICATION, NotificationRequestHeader(consumer_group=GROUP, topic=TOPIC)),
        request(code.HEART_BEAT, body=heartbeat()),
        request(code.UNREGISTER_CLIENT, UnregisterClientRequestHeader(client_id="intruder", consumer_group=GROUP)),
        request(code.CHECK_CLIENT_CONFIG, body=check_client),
        request(code.LOCK_BATCH_MQ, body=lock("intruder")),
        request(code.UNLOCK_BATCH_MQ, body=lock("owner")),
        request(code.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic=TOPIC)),
        request(code.GET_MAX_OFFSET, queue),
        request(code.GET_MIN_OFFSET, queue),
        request(code.GET_EARLIEST_MSG_STORETIME, queue),
        request(code.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequestHeader(topic=TOPIC, queue_id=0, timestamp=0)),
        request(code.QUERY_MESSAGE, QueryMessageRequestHeader(topic=TOPIC, key="k")),
        request(code.VIEW_MESSAGE_BY_ID, ViewMessageByIdRequestHeader(msg_id=msg_id)),
        request(code.QUERY_MESSAGE_TRACE, QueryMessageTraceRequestHeader(msg_id=msg_id)),
        request(code.UPDATE_AND_CREATE_TOPIC, CreateTopicRequestHeader(topic="new-topic", read_queue_nums=2,
                                                                       write_queue_nums=2)),
        request(code.DELETE_TOPIC_IN_BROKER, TopicRequestHeader(topic=TOPIC)),
        request(code.GET_TOPIC_STATS_INFO, TopicRequestHeader(topic=TOPIC)),
        request(code.GET_ALL_TOPIC_CONFIG),
        request(code.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, CreateSubscriptionGroupRequestHeader(group_name="g3")),
        request(code.DELETE_SUBSCRIPTIONGROUP, DeleteSubscriptionGroupRequestHeader(group_name=GROUP)),
        request(code.GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
        request(code.GET_CONSUMER_CONNECTION_LIST, consumer_group),
        request(code.GET_CONSUME_STATS, GetConsumeStatsRequestHeader(consumer_group=GROUP)),
        request(code.GET_CONSUMER_RUNNING_INFO, GetConsumerRunningInfoRequestHeader(consumer_group=GROUP,
                                                                                    client_id="absent")),
        request(code.INVOKE_BROKER_TO_RESET_OFFSET, ResetOffsetRequestHeader(topic=TOPIC, group=GROUP, timestamp=0)),
        request(code.GET_BROKER_RUNTIME_INFO),
        request(code.GET_BROKER_CLUSTER_INFO),
        request(code.AUTH_CREATE_USER, CreateUserRequestHeader(
            username="mallory", signing_key=signing_key("mallory", "x").hex(), user_type="Super")),
        request(code.AUTH_UPDATE_USER, UpdateUserRequestHeader(username="alice", user_type="Super")),
        request(code.AUTH_DELETE_USER, UserRequestHeader(username="alice")),
        request(code.AUTH_GET_USER, UserRequestHeader(username="alice")),
        request(code.AUTH_LIST_USER, ListUsersRequestHeader()),
        request(code.AUTH_CREATE_ACL, body=acl("Topic:u")),
        request(code.AUTH_UPDATE_ACL, body=acl("Topic:t")),
        request(code.AUTH_DELETE_ACL, DeleteAclRequestHeader(subject="User:alice")),
        request(code.AUTH_GET_ACL, GetAclRequestHeader(subject="User:alice")),
        request(code.AUTH_LIST_ACL, ListAclsRequestHeader()),
    ]
    return {cmd.code: cmd for cmd in requests}


def snapshot(broker: Broker) -> dict[str, Any]:
    """Everything a request could change: topics, groups, offsets, queues' max offsets, registered
    consumers and producers, queue locks, users and ACLs."""
    store, auth = broker.store, broker.auth.store
    assert store is not None and auth is not None
    return {
        "topics": sorted(map(repr, broker.topics.topics())),
        "groups": sorted(map(repr, broker.groups.groups())),
        "offsets": sorted(map(repr, broker.offsets.all_offsets())),
        "queues": sorted((key, store.get_max_offset(*key)) for key in store.queue_keys()),
        "consumers": sorted((g.group_name, sorted(g.client_ids()), sorted(g.subscriptions)) for g in
                            broker.consumers.groups()),
        "producers": broker.producers.connection_counts(),
        "locks": {group: sorted(map(repr, broker.locks.owners(group).items())) for group in (GROUP, "g2")},
        "users": sorted(map(repr, auth.users())),
        "acls": sorted(map(repr, auth.acls().items())),
        "pop": sorted((key, state.to_json()) for key, state in broker.pop_service.queues.items())
        if broker.pop_service is not None else [],
    }
