"""Typed errors. One root (`MQError`); every wire response code we raise or branch on has a class.

Processors raise a `ResponseError`; the broker's dispatcher turns it into a response with its
`code` and `remark`; the client turns such a response back into the same class with `error_for`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from protocol.codes import ResponseCode


class MQError(Exception):
    """Root of every rocketq error."""


class ProtocolError(MQError):
    """Bytes or a header that do not follow PROTOCOL.md."""


class FrameError(ProtocolError):
    """A frame that cannot be decoded: bad lengths, oversized, or a header that is not a valid map.
    The connection that sent it is closed after an answer, when one can be addressed."""

    def __init__(self, message: str, opaque: int | None = None) -> None:
        super().__init__(message)
        self.opaque = opaque


RETRIABLE_CODES: frozenset[ResponseCode] = frozenset({
    ResponseCode.SYSTEM_BUSY, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.SUBSCRIPTION_NOT_LATEST, ResponseCode.FLOW_CONTROL,
})
"""The response codes whose errors are `retriable`: the same request may succeed a little later."""


class ResponseError(MQError):
    """An error with a wire response code; `remark` says what went wrong and what to do.

    A subclass names its code among its bases (`class SystemBusy(ResponseError,
    code=ResponseCode.SYSTEM_BUSY)`) or as a class attribute; `retriable` follows from the code
    (`RETRIABLE_CODES`)."""

    code: ClassVar[ResponseCode] = ResponseCode.SYSTEM_ERROR
    retriable: ClassVar[bool] = False
    prepared: Any = None
    """A response the request's handler had prepared before this error: the broker answers it
    with the error's code and remark instead of a bare error response (a durable send past
    `sync_flush_timeout_ms` keeps its header, see `broker.store.FlushDiskTimeoutError`)."""

    def __init_subclass__(cls, code: ResponseCode | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        cls.retriable = cls.code in RETRIABLE_CODES

    def __init__(self, remark: str) -> None:
        super().__init__(remark)
        self.remark = remark

    def __str__(self) -> str:
        return f"{self.code.name}: {self.remark}"


class SystemError_(ResponseError, code=ResponseCode.SYSTEM_ERROR):
    """A request the broker cannot serve as asked (a bad header value, an inconsistent request)."""


class MissingHeaderField(SystemError_, ProtocolError):
    """A request's `ext` lacks a field or has it with the wrong type (answered SYSTEM_ERROR)."""

    def __init__(self, name: str, expected: str, got: object = ...) -> None:
        if got is ...:
            what = "is missing"
        elif got is None:
            what = "is nil"
        else:
            what = f"has type {type(got).__name__} ({got!r:.40})"
        super().__init__(f"field {name!r} {what}; expected {expected}")
        self.field_name = name


class FieldOutOfRange(MissingHeaderField):
    """A request's `ext` field is an integer outside the range its header gives it: MESSAGE_ILLEGAL
    (13) on every request, as the hostile-load issue asks (a mistyped or missing field stays
    SYSTEM_ERROR, as RocketMQ's header decoding answers)."""

    code = ResponseCode.MESSAGE_ILLEGAL

    def __init__(self, name: str, low: int, high: int, got: int) -> None:
        ResponseError.__init__(self, f"field {name!r} is {got}, outside its range {low}..{high}")
        self.field_name = name


class SystemBusy(ResponseError, code=ResponseCode.SYSTEM_BUSY):
    """The broker is too busy for the request now (e.g. a group's SQL92 expressions do not stay
    compiled); retriable."""


class RequestCodeNotSupported(ResponseError, code=ResponseCode.REQUEST_CODE_NOT_SUPPORTED):
    """The peer has no processor for the request code."""


class FlushDiskTimeout(ResponseError, code=ResponseCode.FLUSH_DISK_TIMEOUT):
    """A SYNC_FLUSH write stored but not fsynced within `sync_flush_timeout_ms`; retriable."""


class SlaveNotAvailable(ResponseError, code=ResponseCode.SLAVE_NOT_AVAILABLE):
    """SYNC_MASTER: the message is stored on the master, but fewer than `in_sync_replicas_min`
    replicas (the master included) were in sync, so it is not acknowledged as replicated (RocketMQ's
    SendStatus.SLAVE_NOT_AVAILABLE). Not retriable by itself: a resend stores a second copy."""


class FlushSlaveTimeout(ResponseError, code=ResponseCode.FLUSH_SLAVE_TIMEOUT):
    """SYNC_MASTER: the message is stored on the master, but not enough slaves confirmed it within
    `sync_flush_timeout_ms` (RocketMQ's SendStatus.FLUSH_SLAVE_TIMEOUT); a resend stores a copy."""


class MessageIllegal(ResponseError, code=ResponseCode.MESSAGE_ILLEGAL):
    """A message the broker refuses: too large, too many property bytes, a bad DELAY level."""


class ServiceNotAvailable(ResponseError, code=ResponseCode.SERVICE_NOT_AVAILABLE):
    """The broker cannot take writes now (disk past `disk_space_warning_level_ratio`, or a write or
    fsync failed with ENOSPC/EIO); the remark says which. Retriable: sends resume by themselves
    once the store is writable again. Pulls are still served."""


class NoPermission(ResponseError, code=ResponseCode.NO_PERMISSION):
    """The topic or the group does not allow the operation (e.g. a group that may not consume)."""


class TopicNotExist(ResponseError, code=ResponseCode.TOPIC_NOT_EXIST):
    """The topic does not exist; `topic` names it (empty when rebuilt from a response by `error_for`)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


class QueryNotFound(ResponseError, code=ResponseCode.QUERY_NOT_FOUND):
    """Nothing matches the lookup (a message id or key, a committed offset)."""


class SubscriptionParseFailed(ResponseError, code=ResponseCode.SUBSCRIPTION_PARSE_FAILED):
    """A subscription expression that does not parse, or an unknown expression type."""


class SubscriptionNotExist(ResponseError, code=ResponseCode.SUBSCRIPTION_NOT_EXIST):
    """A pull by a group that is not online or has no subscription to the topic."""


class SubscriptionNotLatest(ResponseError, code=ResponseCode.SUBSCRIPTION_NOT_LATEST):
    """A pull with an older subscription version than the broker holds; retriable."""


class SubscriptionGroupNotExist(ResponseError, code=ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST):
    """The subscription group does not exist."""


class ConsumerNotOnline(ResponseError, code=ResponseCode.CONSUMER_NOT_ONLINE):
    """The consumer group, or the client asked about, has no consumer online."""


class FlowControl(ResponseError, code=ResponseCode.FLOW_CONTROL):
    """The broker sheds load for now; retriable."""


class ReceiptHandleExpired(ResponseError, code=ResponseCode.NO_MESSAGE):
    """POP: an ack or invisible-time change whose receipt handle is no longer current: the message
    became visible again (revived), went to the DLQ, was acked, or its invisible time was changed
    (which issues a new handle). RocketMQ answers such an ack with NO_MESSAGE / an ack failure."""


_BY_CODE: dict[int, type[ResponseError]] = {
    cls.code: cls
    for cls in (
        SystemError_, SystemBusy, RequestCodeNotSupported, FlushDiskTimeout, MessageIllegal, ServiceNotAvailable,
        NoPermission, QueryNotFound, SubscriptionParseFailed, SubscriptionNotExist,
        SubscriptionNotLatest, SubscriptionGroupNotExist, ConsumerNotOnline, FlowControl, ReceiptHandleExpired,
        SlaveNotAvailable, FlushSlaveTimeout,
    )
}


class UnknownResponseCode(ResponseError):
    """A response code this side has no class for; `response_code` keeps the number."""

    def __init__(self, response_code: int, remark: str) -> None:
        super().__init__(f"response code {response_code}: {remark}")
        self.response_code = response_code


def error_for(code: int, remark: str | None) -> ResponseError:
    """The `ResponseError` for a wire response code (a non-SUCCESS one), keeping the remark."""
    text = remark or ""
    if code == ResponseCode.TOPIC_NOT_EXIST:
        err = TopicNotExist.__new__(TopicNotExist)
        ResponseError.__init__(err, text)
        err.topic = ""
        return err
    cls = _BY_CODE.get(code)
    if cls is None:
        return UnknownResponseCode(code, text)
    err2 = cls.__new__(cls)
    ResponseError.__init__(err2, text)
    return err2


class RequestTimeout(MQError):
    """No response within the invoke's timeout."""

    def __init__(self, address: str, code: int, timeout_ms: int) -> None:
        super().__init__(f"request code {code} to {address} got no response within {timeout_ms} ms")
        self.address, self.request_code, self.timeout_ms = address, code, timeout_ms


class ConnectionClosed(MQError):
    """The connection closed before a response arrived (or before a request could be written)."""

    def __init__(self, address: str, reason: str = "connection closed") -> None:
        super().__init__(f"{address}: {reason}")
        self.address = address
