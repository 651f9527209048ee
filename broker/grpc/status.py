"""The gRPC API's `Status` (code + message) for the broker's response codes and errors (pure), as the
Java proxy's `ResponseBuilder.buildStatus` maps a broker's `RemotingCommand` codes, so the
clients' retry logic behaves: TOO_MANY_REQUESTS and INTERNAL_SERVER_ERROR are retried, a 4xx is not."""

from __future__ import annotations

import logging

from broker.grpc.proto import definition_pb2 as pb
from protocol.codes import ResponseCode
from protocol.errors import MQError, ResponseError

log = logging.getLogger(__name__)

_BY_RESPONSE_CODE: dict[int, int] = {
    ResponseCode.SUCCESS: pb.OK,
    ResponseCode.SYSTEM_ERROR: pb.INTERNAL_SERVER_ERROR,
    ResponseCode.SYSTEM_BUSY: pb.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: pb.NOT_IMPLEMENTED,
    ResponseCode.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.MESSAGE_ILLEGAL: pb.BAD_REQUEST,
    ResponseCode.SERVICE_NOT_AVAILABLE: pb.INTERNAL_SERVER_ERROR,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.PULL_NOT_FOUND: pb.MESSAGE_NOT_FOUND,
    ResponseCode.QUERY_NOT_FOUND: pb.MESSAGE_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: pb.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.SUBSCRIPTION_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.NO_MESSAGE: pb.INVALID_RECEIPT_HANDLE,
    ResponseCode.FLOW_CONTROL: pb.TOO_MANY_REQUESTS,
}


def status(code: int = pb.OK, message: str = "OK") -> pb.Status:
    """A `Status` with `code` (a `Code` value) and `message` (cut to 1,000 characters)."""
    return pb.Status(code=code, message=message[:1000])  # type: ignore[arg-type]


def ok() -> pb.Status:
    return status()


def of_response(code: int, remark: str | None) -> pb.Status:
    """The status of a broker response `code` (`ResponseCode`) with its remark; an unknown code is
    INTERNAL_SERVER_ERROR."""
    mapped = _BY_RESPONSE_CODE.get(code, pb.INTERNAL_SERVER_ERROR)
    return status(mapped, "OK" if mapped == pb.OK else (remark or f"response code {code}"))


def of_error(exc: BaseException) -> pb.Status:
    """The status of an error raised translating or handling a call: a `ResponseError` by its code, a
    `GrpcError` as it says, any other exception INTERNAL_SERVER_ERROR (logged)."""
    if isinstance(exc, GrpcError):
        return status(exc.code, str(exc))
    if isinstance(exc, ResponseError):
        return of_response(exc.code, str(exc))
    if isinstance(exc, MQError):
        return status(pb.INTERNAL_SERVER_ERROR, str(exc))
    log.exception("gRPC call failed", exc_info=exc)
    return status(pb.INTERNAL_SERVER_ERROR, f"internal error: {type(exc).__name__}")


class GrpcError(Exception):
    """A refusal with a gRPC API `Code` of its own (ILLEGAL_TOPIC, INVALID_RECEIPT_HANDLE, ...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
