"""`GrpcServer`: RocketMQ 5's gRPC API (`apache.rocketmq.v2.MessagingService`) served in process
on `grpc_port`, with grpcio's asyncio server on the broker's own event loop (RocketMQ's proxy in
"local mode": no separate proxy process, no connection to the broker in between).

The calls run as coroutines beside the broker's other work: a call's translation is a few
microseconds of Python before the broker's own handler, and a held receive is a waiting coroutine,
so nothing blocks the loop (grpcio's C core does the HTTP/2 and TLS work in its own threads).
With `[tls]` on (either mode) the port is TLS only, with the broker's certificate (gRPC cannot
mix plaintext and TLS on one port as the remoting port's "permissive" mode does); with
`require_client_cert`, clients must present a certificate signed by `ca_file`.

The MessagingService calls it serves: QueryRoute, Heartbeat, SendMessage, QueryAssignment,
ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue,
EndTransaction, Telemetry, NotifyClientTermination. PullMessage, UpdateOffset, GetOffset,
QueryOffset, RecallMessage and SyncLiteSubscription answer gRPC UNIMPLEMENTED."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc

from auth.enforcer import Enforcer
from broker.grpc.auth import GrpcAuth
from broker.grpc.calls import GrpcParts
from broker.grpc.consume import ConsumeCalls
from broker.grpc.proto import service_pb2_grpc
from broker.grpc.sessions import Sessions
from broker.remoting.dispatcher import Handler
from conf.tls import TlsConfig, TlsError

log = logging.getLogger(__name__)


class MessagingService(ConsumeCalls, service_pb2_grpc.MessagingServiceServicer):
    """The servicer: every served call is a method of one of its bases."""


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise TlsError(err.errno, f"cannot read tls.{what} {path!r}: {err.strerror}") from err


def server_credentials(config: TlsConfig) -> grpc.ServerCredentials | None:
    """gRPC server credentials of `[tls]` (None when off). Raises `TlsError` naming an unreadable file."""
    if not config.enabled:
        return None
    key, cert = _read(config.key_file, "key_file"), _read(config.cert_file, "cert_file")
    root = _read(config.ca_file, "ca_file") if config.ca_file else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=root,
                                       require_client_auth=config.require_client_cert)


class GrpcServer:
    """`start()` binds `host:port` (0: a free port; `port` then tells) and serves; `stop(grace_ms)`
    ends every Telemetry stream, refuses new calls and lets running ones finish for `grace_ms`,
    then cancels them. `advertised_host`: the host clients are told to reach this port at (routes).
    At most `max_concurrent_calls` calls run at once (held receives and Telemetry streams count):
    a call past it is answered RESOURCE_EXHAUSTED by grpcio, which the clients retry."""

    def __init__(self, parts: GrpcParts, handlers: Mapping[int, Handler], enforcer: Callable[[], Enforcer | None], *,
                 host: str, port: int, advertised_host: str, tls: TlsConfig, max_message_bytes: int,
                 max_concurrent_calls: int = 10_000, delay_levels_ms: tuple[int, ...] = ()) -> None:
        self.sessions = Sessions()
        self.port = port
        self._host, self._tls, self._max_message_bytes = host, tls, max_message_bytes
        self._max_concurrent_calls = max_concurrent_calls
        self.service = MessagingService(parts, handlers, GrpcAuth(enforcer), self.sessions,
                                        lambda: (advertised_host, self.port))
        if delay_levels_ms:
            self.service.delay_levels_ms = delay_levels_ms
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Raises `OSError` (filename "grpc_port") when the port cannot be bound, `TlsError` for an
        unreadable `[tls]` file."""
        credentials = server_credentials(self._tls)
        server = grpc.aio.server(options=[
            ("grpc.so_reuseport", 0),        # another process on the port is an error, not a neighbour
            ("grpc.max_receive_message_length", self._max_message_bytes + 1024 * 1024),
            ("grpc.max_send_message_length", -1),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ], maximum_concurrent_rpcs=self._max_concurrent_calls)    # past it: RESOURCE_EXHAUSTED
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, server)  # type: ignore[no-untyped-call]
        address = f"{self._host}:{self.port}"
        try:
            port = (server.add_secure_port(address, credentials) if credentials is not None
                    else server.add_insecure_port(address))
        except RuntimeError as err:
            port = 0
            log.debug("gRPC bind of %s failed: %s", address, err)
        if port == 0:
            await server.stop(None)
            raise OSError(errno.EADDRINUSE, f"cannot serve the gRPC API on {address}: address in use or not "
                                            "available; set grpc_port to a free port, or 0 to turn it off", "grpc_port")
        self.port = port
        await server.start()
        self._server = server
        log.info("gRPC API (apache.rocketmq.v2.MessagingService) on %s:%d%s", self._host, port,
                 " with TLS" if credentials is not None else "")

    async def stop(self, grace_ms: int) -> None:
        server, self._server = self._server, None
        self.sessions.close_all()
        if server is not None:
            await server.stop(grace_ms / 1000)
