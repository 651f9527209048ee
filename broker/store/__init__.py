"""The message store: commit log, consume queues, reput and flush services (ARCHITECTURE.md)."""

from broker.store.message_store import MessageStore
from broker.store.results import (
    FlushDiskTimeoutError,
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    PutMessageResult,
    PutMessageStatus,
)

__all__ = [
    "FlushDiskTimeoutError",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageFilter",
    "MessageStore",
    "PutMessageResult",
    "PutMessageStatus",
]
