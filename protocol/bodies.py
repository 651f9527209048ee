"""Structured bodies (msgpack values) of PROTOCOL.md, as dataclasses; `decode_body` checks types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, dataclass_transform

import msgpack

from protocol.errors import MissingHeaderField
from protocol.typed import from_value, to_value

T = TypeVar("T")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def body(cls: type[T]) -> type[T]:
    """`@dataclass(frozen=True, slots=True, kw_only=True)`, spelled so type checkers see a dataclass."""
    return dataclass(frozen=True, slots=True, kw_only=True)(cls)


@body
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    expression_type: str = "TAG"
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = 0


@body
class ConsumerData:
    group_name: str
    consume_type: str = "PUSH"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscription_data_set: list[SubscriptionData] = field(default_factory=list)
    unit_mode: bool = False


@body
class CheckClientRequestBody:
    """CHECK_CLIENT_CONFIG: can the broker use this subscription (does its expression compile)?"""

    client_id: str
    group: str
    subscription_data: SubscriptionData


@body
class ProducerData:
    group_name: str


@body
class HeartbeatData:
    client_id: str
    producer_data_set: list[ProducerData] = field(default_factory=list)
    consumer_data_set: list[ConsumerData] = field(default_factory=list)


@body
class ConsumerListBody:
    consumer_id_list: list[str]


@body
class LockBatchBody:
    """LOCK_BATCH_MQ and UNLOCK_BATCH_MQ: `mq_set` items are [topic, broker_name, queue_id]."""

    consumer_group: str
    client_id: str
    mq_set: list[tuple[str, str, int]]


@body
class LockBatchResponseBody:
    lock_ok_mq_set: list[tuple[str, str, int]]


@body
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@body
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]


@body
class TopicConfigData:
    """One topic as a broker registers it with the name servers."""

    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@body
class RegisterBrokerBody:
    """REGISTER_BROKER: every topic the broker serves (all of them, each time: the name server
    replaces what it knew of this broker)."""

    topic_configs: list[TopicConfigData] = field(default_factory=list)


@body
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO: brokers by name and broker names by cluster."""

    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: dict[str, list[str]] = field(default_factory=dict)


@body
class TopicList:
    """GET_ALL_TOPIC_LIST_FROM_NAMESERVER: every topic some live broker registered, sorted."""

    topic_list: list[str] = field(default_factory=list)


@body
class TopicRouteData:
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]


def encode_body(obj: Any) -> bytes:
    """One dataclass (or plain value) as a msgpack body."""
    return msgpack.packb(to_value(obj), use_bin_type=True)  # type: ignore[no-any-return]


def decode_body(cls: type[T], raw: bytes) -> T:
    """`cls` from a msgpack body; raises `MissingHeaderField` (SYSTEM_ERROR) on bad bytes or shape."""
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:
        raise MissingHeaderField("body", f"msgpack {cls.__name__}", exc) from None
    return from_value(cls, value, "body")
