"""`usual_send`: the fields of a SEND_MESSAGE that `SendMessageProcessor.process` takes on its fast
path, read from the request's ext map in one call, and `send_response`, its SUCCESS response (both
in C when `protocol._speedups` was built)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol import native
from protocol.codes import FLAG_RESPONSE, ResponseCode
from protocol.command import RemotingCommand
from protocol.message import (
    PROPERTY_DEDUP,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
)

_SUCCESS = int(ResponseCode.SUCCESS)
UsualSend = tuple[str, int, str, int, int, int, dict[str, str]]
"""(topic, queue_id, producer_group, flag, born_timestamp, reconsume_times, properties)"""


def usual_send_py(fields: Any, body: Any, max_properties_bytes: int, max_message_bytes: int) -> UsualSend | None:
    """The usual send's fields, or None for anything else (the processor's typed path then checks
    field by field and raises the protocol's errors). Usual: `fields` a dict whose topic and
    producer_group are str and queue_id an int; flag an int32, born_timestamp within 0..2**63-1,
    reconsume_times within 0..2**31-1 (each 0 when absent); max_reconsume_times absent, None or an
    int32; properties a dict of str to str with no DELAY, TIMER_DELIVER_MS, TIMER_DELAY_MS,
    TIMER_DELAY_SEC or DEDUP key; `body` bytes; and the properties plainly within
    `max_properties_bytes`, with the body within `max_message_bytes` (at most 4 UTF-8 bytes a
    character and 2 separators an entry of RocketMQ's properties string: the exact size, which
    the typed path measures, is never larger). Ints are exact ints: a bool is not one. The Python
    version of `protocol._speedups.usual_send` (its reference)."""
    if type(fields) is not dict or type(body) is not bytes:
        return None
    topic = fields.get("topic")
    queue_id = fields.get("queue_id")
    group = fields.get("producer_group")
    flag = fields.get("flag", 0)
    born_timestamp = fields.get("born_timestamp", 0)
    reconsume_times = fields.get("reconsume_times", 0)
    properties = fields.get("properties")
    if (type(topic) is not str or type(queue_id) is not int or type(group) is not str
            or type(properties) is not dict or type(flag) is not int or not -0x80000000 <= flag <= 0x7FFFFFFF
            or type(born_timestamp) is not int or not 0 <= born_timestamp <= 0x7FFFFFFFFFFFFFFF
            or type(reconsume_times) is not int or not 0 <= reconsume_times <= 0x7FFFFFFF):
        return None
    max_reconsume_times = fields.get("max_reconsume_times")
    if max_reconsume_times is not None and (type(max_reconsume_times) is not int
                                            or not -0x80000000 <= max_reconsume_times <= 0x7FFFFFFF):
        return None
    if (PROPERTY_DELAY_TIME_LEVEL in properties or PROPERTY_TIMER_DELIVER_MS in properties
            or PROPERTY_TIMER_DELAY_MS in properties or PROPERTY_TIMER_DELAY_SEC in properties
            or PROPERTY_DEDUP in properties):
        return None
    characters = 0
    for key, value in properties.items():
        if type(key) is not str or type(value) is not str:
            return None
        characters += len(key) + len(value)
    size = 4 * characters + 2 * len(properties)
    if size > max_properties_bytes or len(body) + size > max_message_bytes:
        return None
    return topic, queue_id, group, flag, born_timestamp, reconsume_times, properties


_speedups = native.speedups()
usual_send: Callable[[Any, Any, int, int], UsualSend | None] = (
    _speedups.usual_send if _speedups is not None else usual_send_py)
"""`usual_send_py`, in C when `protocol._speedups` was built (a tenth of the broker's Python time
per one-at-a-time send went to these checks)."""


def send_response_py(opaque: int, msg_id_prefix: str, commit_log_offset: int, queue_id: int,
                     queue_offset: int) -> RemotingCommand:
    """A stored send's SUCCESS response (RocketMQ's SendMessageResponseHeader: the offset msg id,
    which is `msg_id_prefix` (`protocol.message.msg_id_prefix` of the store host) and the
    commit_log_offset as 16 hex digits, and the queue id and offset), ext written directly, not
    through the header dataclass. Raises `TypeError` for a `msg_id_prefix` that is not a str.
    The Python version of `protocol._speedups.send_response` (its reference)."""
    return RemotingCommand(_SUCCESS, opaque, FLAG_RESPONSE, None, {
        "msg_id": msg_id_prefix + f"{commit_log_offset:016X}", "queue_id": queue_id, "queue_offset": queue_offset})


send_response: Callable[[int, str, int, int, int], RemotingCommand | None] = (
    _speedups.send_response if _speedups is not None else send_response_py)
"""`send_response_py` in C when `protocol._speedups` was built, else the twin itself; None when the
C function leaves the response to the twin (callers then call `send_response_py`)."""
