"""`ChannelProtocol`, the asyncio protocol of a `Channel` (decoding its received bytes a few frames
at a time when the channel bounds its dispatch), and `connect`, which opens a client channel (over
TLS when given an `ssl.SSLContext`)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import cast

from protocol.channel import Channel, CloseHandler, RequestHandler
from protocol.command import RemotingCommand
from protocol.errors import ConnectionClosed, FrameError
from protocol.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder

log = logging.getLogger(__name__)


class ChannelProtocol(asyncio.Protocol):
    """asyncio protocol wiring a transport to a `Channel`; `on_connect` receives the new channel."""

    def __init__(self, *, on_request: RequestHandler | None = None, on_close: CloseHandler | None = None,
                 on_connect: Callable[[Channel], None] | None = None,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, max_dispatch_per_step: int = 0) -> None:
        self._on_request, self._on_close, self._on_connect = on_request, on_close, on_connect
        self._max_dispatch_per_step = max_dispatch_per_step
        self._decoder = FrameDecoder(max_frame_bytes)
        self.channel: Channel | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet decoded: the partial frame being read, and whole frames
        waiting their turn (`partial_bytes` is only the former)."""
        return self._decoder.buffered_bytes

    @property
    def partial_bytes(self) -> int:
        """Bytes of a frame not yet received whole (0 while whole frames wait undecoded)."""
        return 0 if self._decoder.more else self._decoder.buffered_bytes

    def accepted(self, transport: asyncio.Transport) -> bool:
        """Server side, when something comes before `connection_made` (the first byte and a TLS
        handshake, `protocol.tls_accept`): the connection was accepted on `transport`. False refuses
        it (this method closed `transport`) and nothing more is called; after True, exactly one of
        `connection_made` (then the rest of the protocol) or `abandoned` follows. Default: True."""
        return True

    def abandoned(self, reason: str) -> None:
        """A connection `accepted` closed before `connection_made` (`reason`: "tls_plaintext",
        "tls_handshake", or "closed" by the peer or the server's shutdown). Default: nothing."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.channel = Channel(cast(asyncio.Transport, transport), on_request=self._on_request, on_close=self._on_close,
                               max_dispatch_per_step=self._max_dispatch_per_step)
        self.channel.take_more = self._take_more
        if self._on_connect is not None:
            self._on_connect(self.channel)

    def data_received(self, data: bytes) -> None:
        channel = self.channel
        if channel is None or channel.closed:    # None: a connection refused before it got a channel
            return
        decoder = self._decoder
        try:
            commands = decoder.feed(data, self._max_dispatch_per_step)
        except FrameError as err:
            self.log_frame_error(channel, err)
            channel._frame_error(err)
            return
        self._fed(bool(commands))
        channel._received(commands, decoder.more)

    def _take_more(self, limit: int) -> tuple[list[RemotingCommand], bool]:
        """`Channel.take_more`: decode up to `limit` of the frames waiting in the decoder."""
        channel = self.channel
        assert channel is not None
        try:
            commands = self._decoder.feed(b"", limit)
        except FrameError as err:
            self.log_frame_error(channel, err)
            channel._frame_error(err)
            return [], False
        if not channel.closed:      # (a lost connection's last frames are not reads)
            self._fed(bool(commands))
        return commands, self._decoder.more

    def log_frame_error(self, channel: Channel, err: FrameError) -> None:
        """Log a malformed frame before its connection is closed (the broker rate-limits this)."""
        log.warning("%s: protocol error, closing connection: %s", channel, err)

    def _fed(self, decoded: bool) -> None:
        """After each read that raised no error; `decoded`: at least one whole frame came out.
        A hook for the broker's connection guard (no-op here)."""

    def connection_lost(self, exc: Exception | None) -> None:
        if self.channel is not None:
            self.channel._lost(exc)     # (handles what waited in the decoder first)
        self._decoder.clear()       # the channel and its protocol form a cycle: free the bytes now

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel._pause_writing()

    def resume_writing(self) -> None:
        if self.channel is not None:
            self.channel._resume_writing()


async def connect(host: str, port: int, *, on_request: RequestHandler | None = None,
                  on_close: CloseHandler | None = None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                  timeout_ms: int = 3_000, ssl_context: ssl.SSLContext | None = None,
                  server_hostname: str | None = None) -> Channel:
    """Open a channel to host:port, over TLS with `ssl_context` (the server's certificate checked
    against `server_hostname`, default `host`); raises `ConnectionClosed` when the connection (and
    its handshake) cannot be made within `timeout_ms` (its reason: the OS or TLS error, or "not
    established within `timeout_ms` ms")."""
    loop = asyncio.get_running_loop()
    hostname = (server_hostname or host) if ssl_context is not None else None
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            _, protocol = await loop.create_connection(
                lambda: ChannelProtocol(on_request=on_request, on_close=on_close,
                                        max_frame_bytes=max_frame_bytes), host, port,
                ssl=ssl_context, server_hostname=hostname)
    except TimeoutError:
        raise ConnectionClosed(f"{host}:{port}", f"cannot connect: not established within {timeout_ms} ms") from None
    except OSError as exc:
        raise ConnectionClosed(f"{host}:{port}", f"cannot connect: {exc}") from None
    assert protocol.channel is not None
    return protocol.channel
