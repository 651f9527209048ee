"""Client errors: the shared `MQError` tree plus what only a client meets."""

from __future__ import annotations

from protocol.errors import ConnectionClosed, MQError, RequestTimeout, ResponseError

__all__ = ["ClientError", "ClientStateError", "ConnectionClosed", "MQError", "RequestTimeout",
           "ResponseError"]


class ClientError(MQError):
    """A client-side failure that is not a broker response."""


class ClientStateError(ClientError):
    """An operation that the client's state does not allow (not started, already shut down…)."""
