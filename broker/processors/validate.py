"""Request checks shared by processors: names and numeric ranges, raised as SYSTEM_ERROR, and a
message's size, raised as MESSAGE_ILLEGAL."""

from __future__ import annotations

from collections.abc import Mapping

from protocol.errors import MessageIllegal, SystemError_
from protocol.message import properties_bytes
from protocol.topics import check_group, check_topic


def require_topic_name(topic: str) -> None:
    remark = check_topic(topic)
    if remark is not None:
        raise SystemError_(remark)


def require_group_name(group: str) -> None:
    remark = check_group(group)
    if remark is not None:
        raise SystemError_(remark)


def require_non_negative(name: str, value: int) -> None:
    if value < 0:
        raise SystemError_(f"{name} must be ≥ 0, got {value}")


def check_message_size(body_bytes: int, properties: Mapping[str, str], max_message_bytes: int,
                       max_properties_bytes: int, what: str = "message") -> None:
    """Raise `MessageIllegal` (naming the limit) when the properties' size (`properties_bytes`,
    RocketMQ's properties string) is over `max_properties_bytes`, or the body and properties
    together are over `max_message_bytes`. RocketMQ 4.9 refuses a properties string longer than
    32,767 (`msgCheck`) and a record longer than `maxMessageSize` (`CommitLog`) with
    MESSAGE_ILLEGAL; `what` names the message in the remark ("batch message 3")."""
    size = properties_bytes(properties)
    if size > max_properties_bytes:
        raise MessageIllegal(f"{what} properties of {size} bytes exceed max_properties_bytes {max_properties_bytes} "
                             f"(as RocketMQ, which refuses a properties string over 32,767)")
    if body_bytes + size > max_message_bytes:
        raise MessageIllegal(f"{what} of {body_bytes + size} bytes (body {body_bytes} + properties {size}) "
                             f"exceeds max_message_bytes {max_message_bytes}")
