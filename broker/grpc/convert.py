"""Messages between the gRPC API's `apache.rocketmq.v2.Message` and the broker's stored form (pure).

A sent message becomes SEND_MESSAGE's header fields and body as the Java proxy builds them
(`SendMessageActivity.buildMessageProperty`): `tag` → TAGS, `keys` → KEYS (space-joined),
`message_id` → UNIQ_KEY (the client's id is the message's id), `message_group` →
`__SHARDINGKEY`, `delivery_timestamp` → TIMER_DELIVER_MS (a timer message), a TRANSACTION type →
TRAN_MSG plus PGROUP = the topic (the proxy's producer group of gRPC transactions), the user
properties as they are. A received message goes back the same way, with the POP delivery's
receipt handle, invisible duration and attempt (reconsume times + 1), and a CRC32 body digest
(the clients check it and mark a message without one corrupted)."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Mapping

from broker.grpc.proto import definition_pb2 as pb
from protocol.errors import MessageIllegal
from protocol.message import (
    PROPERTY_KEYS,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    MessageExt,
)
from protocol.transaction import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED

# Properties the broker or RocketMQ's clients set themselves: never shown as user properties.
SYSTEM_PROPERTIES = frozenset({
    PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_SHARDING_KEY, PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP, "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_OUT_MS",
    "TIMER_ROLL_TIMES", "DELAY", "WAIT", "REAL_TOPIC", "REAL_QID", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID",
    "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "MIN_OFFSET", "MAX_OFFSET", "TRANSACTION_CHECK_TIMES",
    "POP_CK", "DEDUP", "TRAN_PREPARED_QUEUE_OFFSET", "__transactionId__", "MSG_REGION", "TRACE_ON",
    "CLUSTER", "INNER_NUM", "INNER_BASE"})
MAX_TIMESTAMP_S = 253_402_300_799       # 9999-12-31T23:59:59Z, protobuf's largest Timestamp


def send_properties(message: pb.Message) -> dict[str, str]:
    """The stored properties of a sent `message`. Raises `MessageIllegal` when a user property uses
    a system property's name, a property is empty-named, or the delivery time is out of range."""
    properties: dict[str, str] = {}
    for key, value in message.user_properties.items():
        if not key or key in SYSTEM_PROPERTIES:
            raise MessageIllegal(f"user property {key[:64]!r} is reserved or empty")
        properties[key] = value
    system = message.system_properties
    if system.HasField("tag"):
        properties[PROPERTY_TAGS] = system.tag
    if system.keys:
        properties[PROPERTY_KEYS] = " ".join(system.keys)
    if system.message_id:
        properties[PROPERTY_UNIQ_KEY] = system.message_id
    if system.HasField("message_group"):
        properties[PROPERTY_SHARDING_KEY] = system.message_group
    if system.HasField("delivery_timestamp"):
        stamp = system.delivery_timestamp
        if not 0 <= stamp.seconds <= MAX_TIMESTAMP_S:
            raise MessageIllegal(f"delivery timestamp {stamp.seconds} s is out of range")
        properties[PROPERTY_TIMER_DELIVER_MS] = str(stamp.seconds * 1000 + stamp.nanos // 1_000_000)
    if system.message_type == pb.TRANSACTION:
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        properties[PROPERTY_PRODUCER_GROUP] = message.topic.name
    return properties


def born_timestamp_ms(message: pb.Message, now_ms: int) -> int:
    """The message's born time in epoch ms (`now_ms` when the client sent none or nonsense)."""
    stamp = message.system_properties.born_timestamp
    if not 0 < stamp.seconds <= MAX_TIMESTAMP_S:
        return now_ms
    return int(stamp.seconds) * 1000 + int(stamp.nanos) // 1_000_000


def message_type(properties: Mapping[str, str]) -> int:
    """The `MessageType` of stored `properties` (transaction, FIFO, delay or normal)."""
    if properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return pb.TRANSACTION
    if PROPERTY_SHARDING_KEY in properties:
        return pb.FIFO
    if PROPERTY_TIMER_DELIVER_MS in properties:
        return pb.DELAY
    return pb.NORMAL


def _set_ms(target: object, epoch_ms: int) -> None:
    target.seconds, target.nanos = divmod(max(epoch_ms, 0), 1000)   # type: ignore[attr-defined]
    target.nanos *= 1_000_000                                         # type: ignore[attr-defined]


def to_proto(message: MessageExt, *, msg_id: str, receipt_handle: str | None = None,
             invisible_ms: int | None = None, topic: str | None = None) -> pb.Message:
    """The `apache.rocketmq.v2.Message` of a stored `message`: `msg_id` is its id as the client
    sees it (UNIQ_KEY, else the offset id); `receipt_handle`/`invisible_ms` for a POP delivery
    (its `delivery_attempt` is `reconsume_times + 1`); `topic` overrides the stored topic."""
    properties = message.properties
    out = pb.Message(body=message.body)
    out.topic.name = topic if topic is not None else message.topic
    for key, value in properties.items():
        if key not in SYSTEM_PROPERTIES:
            out.user_properties[key] = value
    system = out.system_properties
    if PROPERTY_TAGS in properties:
        system.tag = properties[PROPERTY_TAGS]
    if properties.get(PROPERTY_KEYS):
        system.keys.extend(k for k in properties[PROPERTY_KEYS].split(" ") if k)
    system.message_id = msg_id
    system.body_digest.type = pb.CRC32
    system.body_digest.checksum = format(zlib.crc32(message.body) & 0xFFFFFFFF, "08X")
    system.body_encoding = pb.IDENTITY
    system.message_type = message_type(properties)  # type: ignore[assignment]
    _set_ms(system.born_timestamp, message.born_timestamp)
    system.born_host = message.born_host
    _set_ms(system.store_timestamp, message.store_timestamp)
    system.store_host = message.store_host
    if PROPERTY_TIMER_DELIVER_MS in properties:
        with contextlib.suppress(ValueError):
            _set_ms(system.delivery_timestamp, int(properties[PROPERTY_TIMER_DELIVER_MS]))
    system.queue_id = message.queue_id
    system.queue_offset = message.queue_offset
    if PROPERTY_SHARDING_KEY in properties:
        system.message_group = properties[PROPERTY_SHARDING_KEY]
    if receipt_handle is not None:
        system.receipt_handle = receipt_handle
        system.delivery_attempt = message.reconsume_times + 1
    if invisible_ms is not None:
        system.invisible_duration.seconds, millis = divmod(invisible_ms, 1000)
        system.invisible_duration.nanos = millis * 1_000_000
    return out
