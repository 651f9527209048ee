"""Pure mapping from the store's `GetMessageStatus` to a PULL_MESSAGE response code (§2.3)."""

from __future__ import annotations

from broker.store.results import GetMessageStatus
from protocol.codes import ResponseCode

_CODES: dict[GetMessageStatus, ResponseCode] = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


def to_response_code(status: GetMessageStatus, requested_queue_offset: int) -> ResponseCode:
    """RocketMQ `PullMessageProcessor`'s switch: an empty queue (NO_MESSAGE_IN_QUEUE /
    NO_MATCHED_LOGIC_QUEUE) is PULL_NOT_FOUND when the request asked for offset 0, else
    PULL_OFFSET_MOVED."""
    code = _CODES.get(status)
    if code is not None:
        return code
    return ResponseCode.PULL_NOT_FOUND if requested_queue_offset == 0 else ResponseCode.PULL_OFFSET_MOVED
