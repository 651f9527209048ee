"""Queue selectors for ordered sends (RocketMQ `MessageQueueSelector` implementations). Pure."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

from protocol.message import Message
from protocol.model import MessageQueue
from protocol.subscription import tags_code


class MessageQueueSelector(Protocol):
    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue: ...


class SelectMessageQueueByHash:
    """The queue at `abs(hashCode(str(arg))) % len(mqs)`: every message with the same sharding key
    goes to the same queue (RocketMQ uses `arg.hashCode()`; for strings that is Java's
    String.hashCode, which `tags_code` computes)."""

    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        if not mqs:
            raise ValueError("no queue to select from")
        value = arg if isinstance(arg, int) and not isinstance(arg, bool) else tags_code(str(arg))
        return mqs[abs(value) % len(mqs)]


class SelectMessageQueueByRandom:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def select(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        if not mqs:
            raise ValueError("no queue to select from")
        return mqs[self._rng.randrange(len(mqs))]
