"""A SEND_BATCH_MESSAGE body read and checked (`decode_batch`), and whether it is a batch of half
messages (`half_batch`)."""

from __future__ import annotations

from typing import Any, cast

import msgpack

from broker.processors.validate import check_message_size
from protocol import native
from protocol.errors import MessageIllegal
from protocol.headers import INT32_MAX, INT32_MIN
from protocol.message import (
    MAX_PROPERTIES_BYTES,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
)
from protocol.transaction import PROPERTY_TRANSACTION_PREPARED

MAX_BATCH_MESSAGES = 1024
_speedups = native.speedups()
_read_batch_body = _speedups.read_batch_body if _speedups is not None else None

BatchItems = list[tuple[dict[str, str], int, bytes]]


def decode_batch(raw: bytes, max_message_bytes: int,
                 max_properties_bytes: int = MAX_PROPERTIES_BYTES) -> tuple[BatchItems, int]:
    """A SEND_BATCH_MESSAGE body's (properties, flag, body) items and their total body bytes;
    raises `MessageIllegal` naming the first bad item: not [map str→str, int32, bin], a DELAY,
    properties over `max_properties_bytes`, body and properties over `max_message_bytes` (each
    message is checked as a single send is). A plainly well-formed body is read and checked in C
    when `protocol._speedups` was built (`read_batch_body`: the same items); anything else by
    `decode_batch_py`, which names what is wrong."""
    if _read_batch_body is not None:
        plain = _read_batch_body(raw, MAX_BATCH_MESSAGES, max_message_bytes, max_properties_bytes)
        if plain is not None:
            return cast(tuple[BatchItems, int], plain)
    return decode_batch_py(raw, max_message_bytes, max_properties_bytes)


def decode_batch_py(raw: bytes, max_message_bytes: int,
                    max_properties_bytes: int = MAX_PROPERTIES_BYTES) -> tuple[BatchItems, int]:
    """`decode_batch` in Python: every check, item by item."""
    try:
        value: Any = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise MessageIllegal(f"batch body is not msgpack: {exc.__class__.__name__}") from None
    if not isinstance(value, list) or not value:
        raise MessageIllegal("batch body must be a non-empty array of [properties, flag, body]")
    if len(value) > MAX_BATCH_MESSAGES:
        raise MessageIllegal(f"a batch holds at most {MAX_BATCH_MESSAGES} messages, got {len(value)}")
    max_bytes = max_message_bytes
    body_bytes = 0
    for i, item in enumerate(value):       # a tight loop: this runs for every batched message
        if type(item) is not list or len(item) != 3:
            raise MessageIllegal(f"batch message {i} must be [map str→str, int, bin]")
        properties, flag, body = item
        if type(properties) is not dict or type(flag) is not int or type(body) is not bytes:
            raise MessageIllegal(f"batch message {i} must be [map str→str, int, bin]")
        if not INT32_MIN <= flag <= INT32_MAX:
            raise MessageIllegal(f"batch message {i} flag {flag} is outside its range {INT32_MIN}..{INT32_MAX}")
        for key, text in properties.items():
            if type(key) is not str or type(text) is not str:
                raise MessageIllegal(f"batch message {i} must be [map str→str, int, bin]")
        if PROPERTY_DELAY_TIME_LEVEL in properties:
            raise MessageIllegal(f"batch message {i} has a DELAY level: delayed messages are sent one "
                                 f"at a time, not in a batch (as RocketMQ)")
        if (PROPERTY_TIMER_DELIVER_MS in properties or PROPERTY_TIMER_DELAY_MS in properties
                or PROPERTY_TIMER_DELAY_SEC in properties):
            raise MessageIllegal(f"batch message {i} is a timer message (TIMER_DELIVER_MS, TIMER_DELAY_MS or "
                                 f"TIMER_DELAY_SEC): timer messages are sent one at a time, not in a batch")
        check_message_size(len(body), properties, max_bytes, max_properties_bytes, f"batch message {i}")
        body_bytes += len(body)
    # Each item is a 3-element list; the store unpacks it like the tuple it is typed as.
    return cast(BatchItems, value), body_bytes


def half_batch(messages: BatchItems) -> bool:
    """True when every message of the batch is a half message (TRAN_MSG "true": a transactional
    batch, our extension), False when none has TRAN_MSG. Raises `MessageIllegal` for a batch that
    mixes them, or a TRAN_MSG other than "true" (a batch is transactional whole or not at all)."""
    halves = 0
    for properties, _, _ in messages:
        if PROPERTY_TRANSACTION_PREPARED in properties:
            if properties[PROPERTY_TRANSACTION_PREPARED] != "true":
                raise MessageIllegal(f"a batched message's TRAN_MSG must be \"true\", got "
                                     f"{properties[PROPERTY_TRANSACTION_PREPARED][:20]!r}")
            halves += 1
    if halves and halves != len(messages):
        raise MessageIllegal(f"a batch of {len(messages)} messages has {halves} half messages (TRAN_MSG): a "
                             f"batch is transactional whole or not at all")
    return halves > 0
