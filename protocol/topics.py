"""Reserved topic names and name validation (PROTOCOL.md "Names")."""

from __future__ import annotations

import functools
import re

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"        # transactional half messages (queue 0)
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # their resolutions ("d") and check-backs ("c")
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # half messages dropped after the last check
MAX_TOPIC_LENGTH = 127
MAX_GROUP_LENGTH = 255
_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def check_name(kind: str, name: object, max_length: int) -> str | None:
    """None when `name` is a valid topic/group name, else a remark saying what is wrong."""
    if not isinstance(name, str) or not name:
        return f"{kind} name must be a non-empty string"
    if len(name) > max_length:
        return f"{kind} name {name[:40]!r}... is longer than {max_length} characters"
    if not _NAME.fullmatch(name):
        return f"{kind} name {name!r} must match ^[%|a-zA-Z0-9_-]+$"
    return None


@functools.lru_cache(maxsize=4096)
def _check_str(kind: str, name: str, max_length: int) -> str | None:
    return check_name(kind, name, max_length)


def check_topic(topic: object) -> str | None:
    """`check_name` for a topic; answers for strings are memoised (every request checks names)."""
    if isinstance(topic, str):
        return _check_str("topic", topic, MAX_TOPIC_LENGTH)
    return check_name("topic", topic, MAX_TOPIC_LENGTH)


def check_group(group: object) -> str | None:
    if isinstance(group, str):
        return _check_str("group", group, MAX_GROUP_LENGTH)
    return check_name("group", group, MAX_GROUP_LENGTH)
