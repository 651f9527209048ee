"""Messages and their encoding in a body (PROTOCOL.md "Messages in a body").

A stored message is one msgpack array, the same bytes in the commit log and in a pull body:

    [topic, queue_id, queue_offset, commit_log_offset, flag, sys_flag,
     born_timestamp, born_host, store_timestamp, store_host, reconsume_times, properties, body]

Pure code: no I/O.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from protocol import native
from protocol.errors import ProtocolError

PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_CONSUME_START_TIME = "CONSUME_START_TIME"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"      # RocketMQ 5 `MessageConst.PROPERTY_SHARDING_KEY`: the message group
PROPERTY_DLQ_REASON = "DLQ_REASON"          # rocketq's: why the broker stored it in %DLQ%<group>
PROPERTY_DLQ_RESENT_FROM = "DLQ_RESENT_FROM"  # rocketq's: the DLQ msg id `admin dlq resend` copied
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # timer message: deliver at this epoch ms (RocketMQ 5)
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"      # timer message: deliver this many ms after the send
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"    # timer message: deliver this many seconds after the send
PROPERTY_DEDUP = "DEDUP"                        # rocketq's: non-empty: stored once per (group, UNIQ_KEY)
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"          # the broker's: the due time of a message in the timer topic
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"  # the broker's: times a timer message was rolled (put back)
TIMER_PROPERTIES = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELAY_SEC)
KEY_SEPARATOR = " "

MAX_PROPERTIES_BYTES = 32_767       # RocketMQ's limit (Short.MAX_VALUE) on the properties string


def properties_bytes(properties: Mapping[str, str]) -> int:
    """The size of `properties` as RocketMQ's properties string (`key\x01value\x02` per entry,
    UTF-8): what RocketMQ 4.9's `msgContentCheck` and `CommitLog` compare with 32,767
    (`Short.MAX_VALUE`), refusing a longer one with MESSAGE_ILLEGAL. Counts every entry at 2 bytes
    at least, so a size bound also bounds the count. Pure; raises nothing."""
    size = 0
    for key, value in properties.items():
        size += 2 + (len(key) if key.isascii() else len(key.encode("utf-8", "surrogatepass")))
        size += len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    return size


# Field positions in the stored array.
F_TOPIC, F_QUEUE_ID, F_QUEUE_OFFSET, F_COMMIT_LOG_OFFSET, F_FLAG, F_SYS_FLAG = range(6)
F_BORN_TIMESTAMP, F_BORN_HOST, F_STORE_TIMESTAMP, F_STORE_HOST = range(6, 10)
F_RECONSUME_TIMES, F_PROPERTIES, F_BODY = range(10, 13)
STORED_FIELD_COUNT = 13


def stored_origin(fields: Sequence[Any]) -> tuple[int, str, int, int]:
    """(born_timestamp, born_host, reconsume_times, sys_flag) of a stored message's fields: what a
    copy put again keeps of the original (an origin of `MessageStore.put_scheduled`)."""
    return fields[F_BORN_TIMESTAMP], fields[F_BORN_HOST], fields[F_RECONSUME_TIMES], fields[F_SYS_FLAG]


@dataclass(slots=True, kw_only=False)
class Message:
    """A message to send. `tags`, `keys` and `delay_level` are stored as the TAGS, KEYS and DELAY
    properties; `keys` may be one string or several (sent space-separated, as RocketMQ does).
    `message_group` (RocketMQ 5's FIFO message group, the `__SHARDINGKEY` property): the producer
    sends every message of one group to one queue (hash of the group), so a FIFO consumer group
    receives them in order.

    A timer message (RocketMQ 5): `deliver_time_ms` (epoch ms) is sent as TIMER_DELIVER_MS,
    `delay_time_ms` (ms after the broker stores it) as TIMER_DELAY_MS; the broker delivers it no
    earlier than that, at most its `timer_max_delay_sec` ahead (else MESSAGE_ILLEGAL). A
    `delay_level` wins over both, as in RocketMQ. Sent one at a time: a batch refuses them."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | Iterable[str] | None = None
    properties: dict[str, str] | None = None
    delay_level: int = 0
    flag: int = 0
    message_group: str | None = None
    deliver_time_ms: int | None = None
    delay_time_ms: int | None = None

    @property
    def delay_time_level(self) -> int:
        """RocketMQ's name for `delay_level`: deliver the message after the delay of this level of the
        broker's `store.message_delay_level` (1 = 1 s, 2 = 5 s, ... 18 = 2 h by default); 0 = now."""
        return self.delay_level

    @delay_time_level.setter
    def delay_time_level(self, level: int) -> None:
        self.delay_level = level

    def wire_properties(self) -> dict[str, str]:
        """All properties as sent: user properties plus TAGS, KEYS and DELAY."""
        props = dict(self.properties) if self.properties else {}
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else KEY_SEPARATOR.join(self.keys)
        if self.delay_level > 0:
            props[PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_level)
        if self.message_group:
            props[PROPERTY_SHARDING_KEY] = self.message_group
        if self.deliver_time_ms is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_time_ms)
        if self.delay_time_ms is not None:
            props[PROPERTY_TIMER_DELAY_MS] = str(self.delay_time_ms)
        return props


@dataclass(slots=True, kw_only=True)
class MessageExt:
    """A stored message as a consumer receives it. Times are epoch ms; hosts are "ip:port"."""

    topic: str
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = ""
    store_timestamp: int = 0
    store_host: str = ""
    reconsume_times: int = 0
    msg_id: str = ""

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def delay_level(self) -> int:
        return int(self.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0") or 0)


_new_message_ext = object.__new__


def encode_stored_message(
    *, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int, flag: int, sys_flag: int,
    born_timestamp: int, born_host: str, store_timestamp: int, store_host: str, reconsume_times: int,
    properties: Mapping[str, str], body: bytes | memoryview,
) -> bytes:
    """The stored array of one message, as bytes (the commit log's record payload)."""
    return msgpack.packb(  # type: ignore[no-any-return]
        [topic, queue_id, queue_offset, commit_log_offset, flag, sys_flag, born_timestamp, born_host,
         store_timestamp, store_host, reconsume_times, properties, body],
        use_bin_type=True,
    )


def message_from_fields(values: Any, prefixes: dict[str, str] | None = None) -> MessageExt:
    """A `MessageExt` from one decoded stored array; raises `ProtocolError` on a wrong shape.
    `prefixes` caches `msg_id_prefix` per store host across the messages of one body."""
    if type(values) is not list or len(values) != STORED_FIELD_COUNT:
        raise ProtocolError("a stored message is an array of 13 fields")
    (topic, queue_id, queue_offset, commit_log_offset, flag, sys_flag, born_ts, born_host, store_ts,
     store_host, reconsume_times, properties, body) = values
    if type(topic) is not str or type(properties) is not dict or type(body) is not bytes:
        raise ProtocolError("stored message has mistyped topic, properties or body")
    # Explicit type tests, not all(...) over a generator: this runs for every received message.
    if (type(queue_id) is not int or type(queue_offset) is not int or type(commit_log_offset) is not int
            or type(flag) is not int or type(sys_flag) is not int or type(born_ts) is not int
            or type(store_ts) is not int or type(reconsume_times) is not int
            or type(born_host) is not str or type(store_host) is not str):
        raise ProtocolError("stored message has a mistyped integer or host")
    for key, value in properties.items():
        if type(key) is not str or type(value) is not str:
            raise ProtocolError("stored message has a property that is not str → str")
    prefix = prefixes.get(store_host) if prefixes is not None else None
    if prefix is None:
        prefix = msg_id_prefix(store_host)
        if prefixes is not None:
            prefixes[store_host] = prefix
    if not 0 <= commit_log_offset < 1 << 64:
        raise ProtocolError(f"stored message has a bad commit_log_offset {commit_log_offset}")
    # Slots set directly: the dataclass __init__ with 14 keyword arguments costs 4x as much, and
    # this runs for every received message.
    message = _new_message_ext(MessageExt)
    message.topic, message.body, message.properties = topic, body, properties
    message.queue_id, message.queue_offset, message.commit_log_offset = queue_id, queue_offset, commit_log_offset
    message.flag, message.sys_flag, message.reconsume_times = flag, sys_flag, reconsume_times
    message.born_timestamp, message.born_host = born_ts, born_host
    message.store_timestamp, message.store_host = store_ts, store_host
    message.msg_id = prefix + f"{commit_log_offset:016X}"
    return message


def decode_message_batch_py(body: bytes | memoryview) -> list[MessageExt]:
    """Every message of a pull (or VIEW_MESSAGE_BY_ID) body; raises `ProtocolError` on bad bytes.
    The pure-Python version of `decode_message_batch` (the reference for the C one)."""
    unpacker = msgpack.Unpacker(raw=False, use_list=True, strict_map_key=False,
                                max_buffer_size=max(len(body), 1))
    unpacker.feed(body)
    messages: list[MessageExt] = []
    consumed = 0   # the Unpacker's tell() is not reliable after it stops on incomplete data
    try:
        prefixes: dict[str, str] = {}
        for values in unpacker:
            messages.append(message_from_fields(values, prefixes))
            consumed = unpacker.tell()
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"bad message body: {exc}") from exc
    if consumed != len(body):
        raise ProtocolError(f"bad message body: {len(body) - consumed} trailing bytes are not a message")
    return messages


def _decode_message_batch() -> Callable[[bytes | memoryview], list[MessageExt]]:
    """`protocol._speedups.decode_message_batch` when available (see `protocol.native`: the same
    messages and errors in about a third of the time, the slots of each MessageExt written from
    C), else `decode_message_batch_py`."""
    speedups = native.speedups()
    if speedups is None:
        return decode_message_batch_py
    speedups.configure(MessageExt, msg_id_prefix, ProtocolError)
    return speedups.decode_message_batch  # type: ignore[no-any-return]


_MSG_ID = struct.Struct(">4sIQ")
_c_offset_msg_ids: Callable[[str, list[int]], list[str] | None] | None = getattr(
    native.speedups(), "offset_msg_ids", None)
_pack_batch = msgpack.Packer(use_bin_type=True).pack     # stateless between calls: safe to share
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


@functools.lru_cache(maxsize=256)
def msg_id_prefix(store_host: str) -> str:
    """The first 16 hex digits of the ids of messages stored by `store_host` ("ip:port"): IPv4
    address and port; a host that is not IPv4 contributes 0.0.0.0. Cached: it is on the send path."""
    host, _, port = store_host.rpartition(":")
    try:
        packed_ip = ipaddress.IPv4Address(host).packed
    except ValueError:
        packed_ip = b"\0\0\0\0"
    return (packed_ip + (int(port or 0) & 0xFFFFFFFF).to_bytes(4, "big")).hex().upper()


def make_msg_id(store_host: str, commit_log_offset: int) -> str:
    """32 upper-case hex digits: IPv4 (4 bytes), port (4 bytes), commit log offset (8 bytes),
    RocketMQ's offset message id layout. Raises `ValueError` for an offset outside 0..2**64-1."""
    if not 0 <= commit_log_offset < 1 << 64:
        raise ValueError(f"commit_log_offset {commit_log_offset} does not fit 8 bytes")
    return msg_id_prefix(store_host) + f"{commit_log_offset:016X}"


def offset_msg_ids_py(prefix: str, commit_log_offsets: list[int]) -> list[str]:
    """The offset message ids of a batch stored by one host: `prefix` (`msg_id_prefix(store_host)`)
    and each commit-log offset in 16 upper-case hex digits, as `make_msg_id` (which checks the
    offset's range; here the caller's offsets are the store's own). The reference of
    `protocol._speedups.offset_msg_ids` (C)."""
    return [f"{prefix}{offset:016X}" for offset in commit_log_offsets]


def offset_msg_ids(prefix: str, commit_log_offsets: list[int]) -> list[str]:
    """`offset_msg_ids_py`'s ids, made in C when `protocol._speedups` was built (about a fifth of
    the time for a batch of 32: no format call per id)."""
    if _c_offset_msg_ids is not None:
        ids: list[str] | None = _c_offset_msg_ids(prefix, commit_log_offsets)
        if ids is not None:
            return ids
    return offset_msg_ids_py(prefix, commit_log_offsets)


def msg_id_commit_log_offset(msg_id: str) -> int:
    """The commit_log_offset of an offset message id (`parse_msg_id`'s second half, without
    formatting the address); `ValueError` if malformed."""
    if len(msg_id) != 32 or not _HEX_DIGITS.issuperset(msg_id):
        raise ValueError(f"message id {msg_id!r} is not 32 hex digits")
    return int(msg_id[16:], 16)


def msg_id_commit_log_offsets(msg_ids: Sequence[str]) -> list[int]:
    """`msg_id_commit_log_offset` of each id (a batch's answer), the digits checked once for all;
    `ValueError` if any is malformed."""
    if any(len(msg_id) != 32 for msg_id in msg_ids) or not _HEX_DIGITS.issuperset("".join(msg_ids)):
        raise ValueError(f"message ids {list(msg_ids)[:4]!r}... are not all 32 hex digits")
    return [int(msg_id[16:], 16) for msg_id in msg_ids]


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """(store "ip:port", commit_log_offset) of an offset message id; `ValueError` if malformed."""
    if len(msg_id) != 32 or not _HEX_DIGITS.issuperset(msg_id):
        raise ValueError(f"message id {msg_id!r} is not 32 hex digits")
    raw = bytes.fromhex(msg_id)
    ip, port, commit_log_offset = _MSG_ID.unpack(raw)
    return f"{ipaddress.IPv4Address(ip)}:{port}", commit_log_offset


BatchItem = tuple[dict[str, str], int, bytes | bytearray]
"""One message of a SEND_BATCH_MESSAGE body: (wire properties, flag, body)."""


def encode_batch_body(messages: Iterable[Message]) -> bytes:
    """SEND_BATCH_MESSAGE body: array of [properties, flag, body]."""
    return encode_batch_items([(m.wire_properties(), m.flag, m.body) for m in messages])


def encode_batch_items(items: list[BatchItem]) -> bytes:
    """SEND_BATCH_MESSAGE body of (wire properties, flag, body) items (the same bytes as
    `encode_batch_body` of the messages they come from)."""
    return _pack_batch(items)  # type: ignore[no-any-return]


decode_message_batch = _decode_message_batch()
"""Every message of a pull (or VIEW_MESSAGE_BY_ID) body; raises `ProtocolError` on bad bytes."""
