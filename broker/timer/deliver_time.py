"""The due time of a timer message and its properties on the way in and out (RocketMQ 5
`HookUtils.transformTimerMessage`). Pure: no IO, the time is passed in."""

from __future__ import annotations

from collections.abc import Mapping

from protocol.errors import MessageIllegal
from protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    TIMER_PROPERTIES,
)

MAX_DIGITS = 19          # an int64; longer text is refused before `int` parses it
_STRIPPED = (*TIMER_PROPERTIES, PROPERTY_TIMER_OUT_MS)


def is_timer_message(properties: Mapping[str, str]) -> bool:
    """True when `properties` ask for a timer delivery (any of the three TIMER_* keys)."""
    return (PROPERTY_TIMER_DELIVER_MS in properties or PROPERTY_TIMER_DELAY_MS in properties
            or PROPERTY_TIMER_DELAY_SEC in properties)


def _integer(properties: Mapping[str, str], key: str) -> int:
    text = properties[key]
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    if not digits.isascii() or not digits.isdigit() or len(digits) > MAX_DIGITS:
        raise MessageIllegal(f"{key} must be an integer, got {text[:24]!r}")
    return int(stripped)


def deliver_at_ms(properties: Mapping[str, str], now_ms: int, max_delay_ms: int) -> int:
    """The epoch ms at which a timer message is due: TIMER_DELAY_SEC (s after `now_ms`) wins over
    TIMER_DELAY_MS (ms after) over TIMER_DELIVER_MS (epoch ms), RocketMQ's order. Raises
    `MessageIllegal` naming the key for text that is not a decimal int64, a negative value, and a
    due time more than `max_delay_ms` after `now_ms` (RocketMQ answers WHEEL_TIMER_MSG_ILLEGAL
    there; we use MESSAGE_ILLEGAL with the limit in the remark). A time in the past is returned
    as is: the caller delivers it at once."""
    if PROPERTY_TIMER_DELAY_SEC in properties:
        key, value = PROPERTY_TIMER_DELAY_SEC, _integer(properties, PROPERTY_TIMER_DELAY_SEC)
        if value < 0:
            raise MessageIllegal(f"{key} must not be negative, got {value}")
        if value > max_delay_ms // 1000 + 1:
            raise MessageIllegal(f"{key} {value} is beyond timer_max_delay_sec ({max_delay_ms // 1000} s)")
        due = now_ms + value * 1000
    elif PROPERTY_TIMER_DELAY_MS in properties:
        key, value = PROPERTY_TIMER_DELAY_MS, _integer(properties, PROPERTY_TIMER_DELAY_MS)
        if value < 0:
            raise MessageIllegal(f"{key} must not be negative, got {value}")
        due = now_ms + min(value, max_delay_ms + 1)
    else:
        key, due = PROPERTY_TIMER_DELIVER_MS, _integer(properties, PROPERTY_TIMER_DELIVER_MS)
        if due < 0:
            raise MessageIllegal(f"{key} must be an epoch time in ms (not negative), got {due}")
    if due - now_ms > max_delay_ms:
        raise MessageIllegal(f"{key} asks for delivery {due - now_ms} ms ahead, beyond timer_max_delay_sec "
                             f"({max_delay_ms // 1000} s)")
    return due


def to_timer_properties(properties: Mapping[str, str], topic: str, queue_id: int,
                        due_ms: int) -> dict[str, str]:
    """The properties a timer message is stored with in the timer topic: its own, plus
    TIMER_OUT_MS (the due time), REAL_TOPIC and REAL_QID (where it is delivered)."""
    return {**properties, PROPERTY_TIMER_OUT_MS: str(due_ms), PROPERTY_REAL_TOPIC: topic,
            PROPERTY_REAL_QUEUE_ID: str(queue_id)}


def without_timer_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """`properties` minus TIMER_DELIVER_MS, TIMER_DELAY_MS, TIMER_DELAY_SEC and TIMER_OUT_MS: a
    delivered timer message, a past one stored at once, and a DELAY message (the level wins, as
    RocketMQ's `checkIfTimerMessage` clears them)."""
    return {key: value for key, value in properties.items() if key not in _STRIPPED}


def timer_due_of(properties: Mapping[str, str]) -> int:
    """The due time a message of the timer topic carries (TIMER_OUT_MS), its consume-queue unit's
    tags code; 0 when missing or not an integer (such a message is delivered at once)."""
    try:
        return int(properties.get(PROPERTY_TIMER_OUT_MS, "0"))
    except ValueError:
        return 0


def has_delay_level(properties: Mapping[str, str]) -> bool:
    """True when `properties` carry a DELAY level > 0 (a delayed message: the level wins over the
    timer properties); a DELAY of 0 or less is no delay, as the store reads it."""
    try:
        return int(properties.get(PROPERTY_DELAY_TIME_LEVEL, "0")) > 0
    except ValueError:
        return False
