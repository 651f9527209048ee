"""Values crossing the store boundary: put/get results, their statuses (RocketMQ 4.x names), the
message-filter protocol the store calls during a pull, and the store's typed errors."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from protocol.errors import FlushDiskTimeout, ServiceNotAvailable


class PutMessageStatus(enum.Enum):
    """RocketMQ `PutMessageStatus`. This store produces PUT_OK, MESSAGE_ILLEGAL (empty batch, bad
    topic or queue_id, a body over `max_message_bytes`, a record larger than a segment) and
    SERVICE_NOT_AVAILABLE (not started or stopping, disk past its warning level, a failed write;
    `remark` says which); flush timeouts are raised by `wait_flushed`."""

    PUT_OK = "PUT_OK"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


@dataclass(slots=True)
class PutMessageResult:
    """`queue_offset`: the first message's (a batch has consecutive ones), -1 unless PUT_OK.
    `commit_log_offsets`: one per message (for msg ids), empty unless PUT_OK.
    `end_offset`: the commit-log write position after this put; pass it to `wait_flushed`.
    Not frozen, as `GetMessageResult`: one is made per put, and a frozen dataclass's `__init__`
    (`object.__setattr__` per field) cost 0.58 µs against 0.17; nothing changes one once made."""

    status: PutMessageStatus
    queue_offset: int
    commit_log_offsets: list[int]
    end_offset: int
    remark: str = ""              # why, for SERVICE_NOT_AVAILABLE (disk full, write error, stopping)

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


class GetMessageStatus(enum.Enum):
    """RocketMQ 4.x `GetMessageStatus`; REFERENCE.md §2.1 says when each occurs."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class GetMessageResult:
    """`messages`: each the raw stored payload (a 13-field msgpack array) as a view into the commit
    log, so a response body is their concatenation (`decode_message_batch` reads it back); the
    views stay valid while the store runs. `total_bytes` is the sum of their lengths.
    `next_begin_offset`, `min_offset`, `max_offset` are queue offsets (REFERENCE.md §2.1)."""

    status: GetMessageStatus
    messages: list[memoryview]
    next_begin_offset: int
    min_offset: int
    max_offset: int
    message_count: int
    total_bytes: int


class MessageFilter(Protocol):
    """What `get_message` asks of a subscription filter (RocketMQ `MessageFilter`).

    `match_by_consume_queue` sees a unit's tags_code (Java String.hashCode of TAGS, 0 if none).
    `match_by_commit_log` sees the message's properties and is only called when `needs_properties`
    is True (an SQL92 filter); a TAG filter sets it False so the pull decodes nothing."""

    @property
    def needs_properties(self) -> bool: ...

    def match_by_consume_queue(self, tags_code: int) -> bool: ...

    def match_by_commit_log(self, properties: dict[str, str] | None) -> bool: ...


class MatchedOffsets(Protocol):
    """The queue offsets a filter is known to match on one queue (`broker.filter.match_index`),
    which lets `get_message` read just those messages."""

    def covers(self, queue_offset: int, max_offset: int) -> bool: ...

    def matches_from(self, queue_offset: int, limit: int) -> list[int]: ...


class FlushDiskTimeoutError(FlushDiskTimeout):
    """SYNC_FLUSH: the message was written but not fsynced within `sync_flush_timeout_ms` (or the
    fsync failed). Carries the FLUSH_DISK_TIMEOUT response code. `prepared`: what the timed-out
    waiter would have been resolved with; for a send, its response, which the broker then answers
    with FLUSH_DISK_TIMEOUT and this remark, so the producer still learns the message's id, queue
    and offset (RocketMQ's SendMessageProcessor answers FLUSH_DISK_TIMEOUT with the send's header).
    A failed fsync has none (its error is shared by every waiter)."""

    def __init__(self, end_offset: int, reason: str, prepared: object = None) -> None:
        super().__init__(f"commit log not flushed to {end_offset}: {reason}")
        self.end_offset = end_offset
        self.prepared = prepared


class StoreNotWritableError(ServiceNotAvailable):
    """The commit-log fsync covering a send failed (ENOSPC, EIO): the send is not acknowledged and
    the store refuses sends until space is back. Carries SERVICE_NOT_AVAILABLE."""
