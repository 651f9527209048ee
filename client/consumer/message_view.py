"""`MessageView`: a message as a `SimpleConsumer` receives it, with the field names of RocketMQ 5's
Python client (`rocketmq.v5.model.Message` as a received message): `message_id`, `topic`, `body`,
`tag`, `keys`, `properties`, `message_group`, `delivery_timestamp`, `delivery_attempt` (1 on the
first delivery), `receipt_handle` (what `ack` and `change_invisible_duration` send back),
`born_host`, `born_timestamp`; plus `queue_id`, `offset` (the queue offset), `broker_name`,
`reconsume_times` (= `delivery_attempt - 1`) and `ext` (the full `MessageExt`)."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from protocol.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    MessageExt,
)

T = TypeVar("T")


if TYPE_CHECKING:
    class _FromExt(Generic[T]):
        """A read-only attribute of `MessageView` that is the `MessageExt` field `name`."""

        def __init__(self, name: str) -> None: ...

        def __get__(self, view: MessageView, owner: type | None = None) -> T: ...
else:
    class _FromExt(property):
        """At run time a `property` over an `attrgetter`, so a read runs no Python code (a Python
        `__get__` was a few % of a receive+ack loop's CPU: acks read `topic`, `queue_id` and
        `offset` of every message)."""

        def __init__(self, name: str) -> None:
            super().__init__(attrgetter(f"ext.{name}"))


@dataclass(slots=True, eq=False)
class MessageView:
    ext: MessageExt
    receipt_handle: str
    broker_name: str
    broker_address: str
    invisible_duration_ms: int
    topic: ClassVar[_FromExt[str]] = _FromExt("topic")
    body: ClassVar[_FromExt[bytes]] = _FromExt("body")
    properties: ClassVar[_FromExt[dict[str, str]]] = _FromExt("properties")
    reconsume_times: ClassVar[_FromExt[int]] = _FromExt("reconsume_times")
    born_host: ClassVar[_FromExt[str]] = _FromExt("born_host")
    born_timestamp: ClassVar[_FromExt[int]] = _FromExt("born_timestamp")
    queue_id: ClassVar[_FromExt[int]] = _FromExt("queue_id")
    offset: ClassVar[_FromExt[int]] = _FromExt("queue_offset")     # the queue offset

    @property
    def message_id(self) -> str:
        """The producer's message id (UNIQ_KEY) when set, else the broker's offset id."""
        return self.ext.properties.get(PROPERTY_UNIQ_KEY) or self.ext.msg_id

    @property
    def tag(self) -> str | None:
        return self.ext.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.ext.properties.get(PROPERTY_KEYS)
        return raw.split(KEY_SEPARATOR) if raw else []

    @property
    def message_group(self) -> str | None:
        return self.ext.properties.get(PROPERTY_SHARDING_KEY)

    @property
    def delivery_timestamp(self) -> int | None:
        """When a delayed message became deliverable (epoch ms); None for a plain message."""
        return self.ext.store_timestamp if PROPERTY_DELAY_TIME_LEVEL in self.ext.properties else None

    @property
    def delivery_attempt(self) -> int:
        return self.ext.reconsume_times + 1

    def __repr__(self) -> str:
        return (f"MessageView(topic={self.topic!r}, message_id={self.message_id!r}, queue_id={self.queue_id}, "
                f"offset={self.offset}, delivery_attempt={self.delivery_attempt})")
