"""`BROKER_CODE_MAP`: what every request code the broker handles needs, after RocketMQ 5.3's
`DefaultAuthorizationContextBuilder` and its headers' `@RocketMQAction` annotations (see
`auth.requirements` for the shapes; any one of a requirement's actions suffices).

Producing and consuming, as RocketMQ:
- SEND_MESSAGE, SEND_BATCH_MESSAGE: Pub on the topic; to a retry topic `%RETRY%g`, Sub on Group g
  (RocketMQ takes the producer group when one is given; we take g, so a producer cannot write into
  another group's retries by naming its own group).
- PULL_MESSAGE: Sub on the topic (not for a retry topic) and Sub on the group; POP_MESSAGE,
  ACK_MESSAGE, BATCH_ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, NOTIFICATION the same (RocketMQ 5.3's
  `@RocketMQAction`).
- QUERY_CONSUMER_OFFSET: Sub or Get on the topic and the group; UPDATE_CONSUMER_OFFSET: Sub or Update.
- END_TRANSACTION: Pub on its (real) topic, as RocketMQ 5.3's `EndTransactionRequestHeader`;
  END_TRANSACTION_BATCH (ours): Pub on each entry's topic, as END_TRANSACTION would need.
- CONSUMER_SEND_MSG_BACK, GET_CONSUMER_LIST_BY_GROUP (Sub or Get), UNREGISTER_CLIENT (its
  consumer group, if any): Sub on the group.
- HEART_BEAT, CHECK_CLIENT_CONFIG: Sub on each consumer group and each subscribed topic (retry
  topics skipped); a producer-only heartbeat needs nothing beyond authentication, as RocketMQ.
- LOCK_BATCH_MQ, UNLOCK_BATCH_MQ: Sub on the group and on each queue's topic (retry skipped).
- GET_ROUTEINFO_BY_TOPIC: Pub, Sub or Get on the topic (a retry topic: Sub or Get on its group).
- GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME, SEARCH_OFFSET_BY_TIMESTAMP,
  QUERY_MESSAGE: Sub or Get on the topic (RocketMQ: Get, but a consumer needs these to find where
  to start, so Sub is enough here).

Administration (RocketMQ's annotations; where RocketMQ leaves a code unchecked we do not):
- UPDATE_AND_CREATE_TOPIC: Create on the topic; DELETE_TOPIC_IN_BROKER: Delete;
  GET_TOPIC_STATS_INFO: Get. GET_ALL_TOPIC_CONFIG: List on `Topic:*` (every topic).
- UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: Create or Update on the group; DELETE_SUBSCRIPTIONGROUP:
  Delete; GET_CONSUMER_CONNECTION_LIST, GET_CONSUMER_RUNNING_INFO: Get on the group;
  GET_CONSUME_STATS: Get on the group (and the topic when given);
  GET_ALL_SUBSCRIPTIONGROUP_CONFIG: List on `Group:*`.
- INVOKE_BROKER_TO_RESET_OFFSET: Update on the group and the topic.
- GET_BROKER_RUNTIME_INFO, GET_BROKER_CLUSTER_INFO: Get on Cluster; VIEW_MESSAGE_BY_ID: Get on
  Cluster (the id names no topic, so a topic's rights cannot cover it); QUERY_MESSAGE_TRACE: Get on
  Cluster (rocketq's; a trace spans topics, retry and DLQ topics and groups).
- AUTH_*: Update on Cluster (changes) or Get on Cluster (reads).

`tests/broker/auth/test_code_map.py` fails for any code the broker registers without an entry."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from auth.requirements import (
    AUTH_CODE_MAP,
    CREATE,
    DELETE,
    EVERY,
    GET,
    LIST,
    PUB,
    SUB,
    SUB_OR_GET,
    UPDATE,
    Requirement,
    RequirementBuilder,
    ResourceUnknown,
    field,
    fixed,
    keyed,
    on_group,
    on_group_and_topic,
    on_topic,
    optional_field,
    route_query,
    topic_for,
)
from protocol.bodies import CheckClientRequestBody, HeartbeatData, LockBatchBody, decode_body
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.errors import MissingHeaderField, ResponseError
from protocol.transaction import decode_end_batch

T = TypeVar("T")


def _body(cls: type[T], request: RemotingCommand) -> T:
    try:
        return decode_body(cls, request.body_bytes())
    except MissingHeaderField as exc:
        raise ResourceUnknown(f"the body names no resource ({exc.remark})") from None


def _subscribed(group: str, topics: Iterable[str]) -> list[Requirement]:
    required: list[Requirement] = [("Group", group, SUB)]
    for topic in topics:
        required += topic_for(topic, SUB, None)
    return required


def send(request: RemotingCommand) -> list[Requirement]:
    """Pub on the topic; a retry topic `%RETRY%g`: Sub on Group g."""
    return topic_for(field(request, "topic"), PUB, SUB)


keyed(send, "topic")


def end_transaction_batch(request: RemotingCommand) -> list[Requirement]:
    """Pub on every entry's topic (a retry topic: Pub on its group, as END_TRANSACTION)."""
    try:
        entries = decode_end_batch(request.body_bytes())
    except ResponseError as exc:
        raise ResourceUnknown(f"the body names no resource ({exc.remark})") from None
    required: list[Requirement] = []
    for topic in dict.fromkeys(entry[0] for entry in entries):
        if not topic:
            raise ResourceUnknown("an entry names no topic")
        required += topic_for(topic, PUB, PUB)
    return required


def heart_beat(request: RemotingCommand) -> list[Requirement]:
    required: list[Requirement] = []
    for consumer in _body(HeartbeatData, request).consumer_data_set:
        required += _subscribed(consumer.group_name, (s.topic for s in consumer.subscription_data_set))
    return required


def check_client_config(request: RemotingCommand) -> list[Requirement]:
    data = _body(CheckClientRequestBody, request)
    return _subscribed(data.group, [data.subscription_data.topic])


def queue_lock(request: RemotingCommand) -> list[Requirement]:
    data = _body(LockBatchBody, request)
    return _subscribed(data.consumer_group, dict.fromkeys(mq[0] for mq in data.mq_set))


def unregister_client(request: RemotingCommand) -> list[Requirement]:
    group = optional_field(request, "consumer_group")
    return [] if group is None else [("Group", group, SUB)]


BROKER_CODE_MAP: dict[int, RequirementBuilder] = {
    # producing and consuming
    RequestCode.SEND_MESSAGE: send,
    RequestCode.SEND_BATCH_MESSAGE: send,
    RequestCode.PULL_MESSAGE: on_group_and_topic(SUB),
    RequestCode.POP_MESSAGE: on_group_and_topic(SUB),
    RequestCode.ACK_MESSAGE: on_group_and_topic(SUB),
    RequestCode.BATCH_ACK_MESSAGE: on_group_and_topic(SUB),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: on_group_and_topic(SUB),
    RequestCode.NOTIFICATION: on_group_and_topic(SUB),
    RequestCode.QUERY_CONSUMER_OFFSET: on_group_and_topic(SUB_OR_GET),
    RequestCode.UPDATE_CONSUMER_OFFSET: on_group_and_topic(("Sub", "Update")),
    RequestCode.CONSUMER_SEND_MSG_BACK: on_group(SUB, "group"),
    RequestCode.END_TRANSACTION: on_topic(PUB),
    RequestCode.END_TRANSACTION_BATCH: end_transaction_batch,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: on_group(SUB_OR_GET),
    RequestCode.HEART_BEAT: heart_beat,
    RequestCode.UNREGISTER_CLIENT: unregister_client,
    RequestCode.CHECK_CLIENT_CONFIG: check_client_config,
    RequestCode.LOCK_BATCH_MQ: queue_lock,
    RequestCode.UNLOCK_BATCH_MQ: queue_lock,
    RequestCode.GET_ROUTEINFO_BY_TOPIC: route_query,
    RequestCode.GET_MAX_OFFSET: on_topic(SUB_OR_GET),
    RequestCode.GET_MIN_OFFSET: on_topic(SUB_OR_GET),
    RequestCode.GET_EARLIEST_MSG_STORETIME: on_topic(SUB_OR_GET),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: on_topic(SUB_OR_GET),
    RequestCode.QUERY_MESSAGE: on_topic(SUB_OR_GET),
    # topics
    RequestCode.UPDATE_AND_CREATE_TOPIC: on_topic(CREATE),
    RequestCode.DELETE_TOPIC_IN_BROKER: on_topic(DELETE),
    RequestCode.GET_TOPIC_STATS_INFO: on_topic(GET),
    RequestCode.GET_ALL_TOPIC_CONFIG: fixed(("Topic", EVERY, LIST)),
    # groups
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: on_group(("Create", "Update"), "group_name"),
    RequestCode.DELETE_SUBSCRIPTIONGROUP: on_group(DELETE, "group_name"),
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: fixed(("Group", EVERY, LIST)),
    RequestCode.GET_CONSUMER_CONNECTION_LIST: on_group(GET),
    RequestCode.GET_CONSUMER_RUNNING_INFO: on_group(GET),
    RequestCode.GET_CONSUME_STATS: on_group_and_topic(GET, topic_optional=True),
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: on_group_and_topic(UPDATE, "group"),
    # the broker itself
    RequestCode.GET_BROKER_RUNTIME_INFO: fixed(("Cluster", "", GET)),
    RequestCode.GET_BROKER_CLUSTER_INFO: fixed(("Cluster", "", GET)),
    RequestCode.VIEW_MESSAGE_BY_ID: fixed(("Cluster", "", GET)),
    RequestCode.QUERY_MESSAGE_TRACE: fixed(("Cluster", "", GET)),
    **AUTH_CODE_MAP,
}
