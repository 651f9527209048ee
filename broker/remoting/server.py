"""`RemotingServer`: accepts TCP connections and tracks their channels; every connection goes
through the `ConnectionGuard` (connection cap, frame and idle deadlines, broker-wide buffer cap),
and with `tls` through a `TlsAcceptor` first (TLS, or plaintext too when permissive)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from broker.remoting.guard import ConnectionGuard, GuardedProtocol
from protocol.channel import Channel, RequestHandler
from protocol.tls_accept import TlsAcceptor

log = logging.getLogger(__name__)


class RemotingServer:
    def __init__(self, host: str, port: int, *, on_request: RequestHandler,
                 on_close: Callable[[Channel], None], max_frame_bytes: int, guard: ConnectionGuard,
                 max_requests_per_step: int = 0, tls: TlsAcceptor | None = None) -> None:
        self._host, self._port = host, port
        self._tls = tls
        self.guard = guard
        self._on_request, self._on_close = on_request, on_close
        self._max_frame_bytes = max_frame_bytes
        self._max_requests_per_step = max_requests_per_step      # `Channel`'s max_dispatch_per_step
        self._server: asyncio.Server | None = None
        self.channels: set[Channel] = set()

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Bind (the port is known after this) without accepting yet; raises `OSError` when the
        address is taken."""
        loop = asyncio.get_running_loop()
        tls = self._tls
        factory: Callable[[], asyncio.Protocol] = self.protocol if tls is None else lambda: tls.wrap(self.protocol())
        self._server = await loop.create_server(
            factory, self._host, self._port, reuse_address=True, backlog=1024, start_serving=False)

    def protocol(self) -> GuardedProtocol:
        """The protocol of one accepted connection (the server's factory). `bench.inproc` also
        hands one a transport of its own, to feed the broker frames in process."""
        return GuardedProtocol(self.guard, on_request=self._on_request, on_close=self._closed,
                               on_connect=self.channels.add, max_frame_bytes=self._max_frame_bytes,
                               max_dispatch_per_step=self._max_requests_per_step)

    async def begin_serving(self) -> None:
        """Accept connections from now on."""
        assert self._server is not None
        await self._server.start_serving()

    def _closed(self, channel: Channel) -> None:
        self.channels.discard(channel)
        self._on_close(channel)

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Close every connection (TLS handshakes in progress too) and the listening socket."""
        self.stop_accepting()
        if self._tls is not None:
            await self._tls.close()
        for channel in list(self.channels):
            channel.close()
        waits = [asyncio.wait_for(ch.wait_closed(), 2) for ch in list(self.channels)]
        if waits:
            await asyncio.gather(*waits, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
