"""Request checks shared by processors: names and numeric ranges, raised as SYSTEM_ERROR."""

from __future__ import annotations

from protocol.errors import SystemError_
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
