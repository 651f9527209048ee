"""`MetricsHttpServer`: the Prometheus endpoint (`GET /metrics`), an asyncio server on the loop of a
broker or a name server (shared by both, so it lives here).

prometheus_client's own server runs collectors in a thread; the broker's read the store, the offset
table and the registries, which only the loop may touch (the store is synchronous and unlocked). So
the endpoint is a small asyncio HTTP/1.1 server whose `render` copies that state on the loop and
formats the text in a thread (`BrokerMetrics.render`): one request per connection
(`Connection: close`), request head bounded to 16 KiB and 10 s, any path answered with the
exposition (Prometheus asks `/metrics`), any method other than GET/HEAD answered 405. With an
`ssl.SSLContext` it is HTTPS only, the handshake and the TLS shutdown each bounded by
`handshake_timeout_ms` (prometheus_client's HTTPS server does its handshakes one at a time in its
accepting thread, so one silent client would stall it)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST

from protocol.tls_accept import TlsAcceptor

log = logging.getLogger(__name__)

Render = Callable[[], Awaitable[bytes]]
MAX_HEAD_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0


class MetricsHttpServer:
    def __init__(self, render: Render) -> None:
        self._render = render
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("metrics server is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                    handshake_timeout_ms: int = 10_000) -> int:
        """Listen on host:port (0: a free port), HTTPS with `ssl_context`; returns the port.
        Raises `OSError` when taken."""
        timeout_s = handshake_timeout_ms / 1000 if ssl_context is not None else None
        self._server = await asyncio.start_server(
            self._serve, host, port, reuse_address=True, limit=MAX_HEAD_BYTES, ssl=ssl_context,
            ssl_handshake_timeout=timeout_s, ssl_shutdown_timeout=timeout_s)
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method = head.split(b" ", 1)[0].upper()
            if method not in (b"GET", b"HEAD"):
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\n"
                             b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            else:
                body = await self._render()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + CONTENT_TYPE_LATEST.encode()
                             + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n")
                if method == b"GET":
                    writer.write(body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):   # (TLS errors too)
            pass
        except Exception:
            log.exception("metrics request failed")
        finally:
            writer.close()
            if task is not None:
                self._handlers.discard(task)

    async def close(self) -> None:
        """Stop listening and cancel scrapes still running."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()


class MetricsEndpoint:
    """What a metrics holder (the broker's, the name server's) needs to serve its /metrics:
    `serve_metrics(render, host, port, tls)` starts a `MetricsHttpServer` (HTTPS with `tls`: the
    server port's context and handshake timeout) and returns the bound port; `close()` stops it."""

    _http: MetricsHttpServer | None = None

    async def serve_metrics(self, render: Callable[[], Awaitable[bytes]], host: str, port: int,
                            tls: TlsAcceptor | None) -> int:
        http = MetricsHttpServer(render)
        bound = await http.start(host, port, ssl_context=tls.context if tls else None,
                                 handshake_timeout_ms=tls.handshake_timeout_ms if tls else 0)
        self._http = http
        return bound

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()
