"""`RemotingClient`: one channel per address, opened on demand and reopened after a drop. Used by
clients (to brokers and name servers), and by brokers (to name servers).

Inbound requests from the peer (NOTIFY_CONSUMER_IDS_CHANGED) go to the handler registered for their
code. Everything runs on the caller's event loop; like `channel.py`, this is one of protocol's few
asyncio modules."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

from protocol.channel import Channel
from protocol.channel_protocol import connect
from protocol.command import RemotingCommand
from protocol.errors import ConnectionClosed
from protocol.signing import Credentials, signer

log = logging.getLogger(__name__)
WRITE_AT_ONCE_BYTES = 8 * 1024
"""A request frame at least this long leaves at once (`Channel.write_at_once_bytes`), not with the
loop step's other frames at its end: a transaction producer's batch of 64 half messages (~15 KB)
reaches the broker while the client still builds the next (issue #38). A plain send of 32
messages of 128 B (~6 KB) is still joined."""
InboundHandler = Callable[[Channel, RemotingCommand], None]


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return host, int(port)


class RemotingClient:
    """`credentials`, when given, sign every request sent on every channel (`protocol.signing`);
    with `ssl_context` every connection is TLS, the certificate checked against the address's host."""

    def __init__(self, *, connect_timeout_ms: int = 3_000, max_frame_bytes: int = 64 * 1024 * 1024,
                 credentials: Credentials | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context
        self._channels: dict[str, Channel] = {}
        self._connecting: dict[str, asyncio.Future[Channel]] = {}
        self._handlers: dict[int, InboundHandler] = {}
        self._connect_timeout_ms = connect_timeout_ms
        self._max_frame_bytes = max_frame_bytes
        self._closed = False
        self._ever_connected: set[str] = set()
        self.credentials = credentials
        self._signer = signer(credentials) if credentials is not None else None
        self.on_disconnect: Callable[[str], None] | None = None
        self.on_reconnect: Callable[[str], None] | None = None   # a new channel to a known address

    def register_handler(self, code: int, handler: InboundHandler) -> None:
        self._handlers[code] = handler

    def _on_request(self, channel: Channel, cmd: RemotingCommand) -> None:
        handler = self._handlers.get(cmd.code)
        if handler is None:
            log.debug("no handler for broker request code %d from %s", cmd.code, channel)
            return
        handler(channel, cmd)

    async def channel(self, address: str) -> Channel:
        """The open channel to `address`, connecting if needed; raises `ConnectionClosed`."""
        if self._closed:
            raise ConnectionClosed(address, "client is shut down")
        channel = self._channels.get(address)
        if channel is not None and not channel.closed:
            return channel
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Channel] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            host, port = split_address(address)
            channel = await connect(host, port, on_request=self._on_request, on_close=self._closed_channel,
                                    max_frame_bytes=self._max_frame_bytes, timeout_ms=self._connect_timeout_ms,
                                    ssl_context=self._ssl_context)
            channel.attributes["address"] = address
            channel.signer = self._signer
            channel.write_at_once_bytes = WRITE_AT_ONCE_BYTES
            self._channels[address] = channel
            future.set_result(channel)
            if address in self._ever_connected and self.on_reconnect is not None:
                self.on_reconnect(address)
            self._ever_connected.add(address)
            return channel
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()   # mark retrieved: waiters re-raise it
            raise
        finally:
            del self._connecting[address]

    def _closed_channel(self, channel: Channel) -> None:
        address = channel.attributes.get("address")
        if address is not None and self._channels.get(address) is channel:
            del self._channels[address]
            if self.on_disconnect is not None and not self._closed:
                self.on_disconnect(address)

    def invoke(self, address: str, cmd: RemotingCommand, timeout_ms: int) -> Coroutine[Any, Any, RemotingCommand]:
        """Send `cmd` to `address` (connecting if needed) and await its response; raises
        `RequestTimeout` or `ConnectionClosed`. Awaited like a coroutine function, but with the
        channel open it hands back `Channel.invoke`'s coroutine itself: one coroutine layer less
        on every request (each layer is paid again when the response resumes the caller)."""
        channel = self._channels.get(address)
        if channel is not None and not channel.closed and not self._closed:
            return channel.invoke(cmd, timeout_ms)
        return self._connect_and_invoke(address, cmd, timeout_ms)

    async def _connect_and_invoke(self, address: str, cmd: RemotingCommand, timeout_ms: int) -> RemotingCommand:
        channel = await self.channel(address)
        return await channel.invoke(cmd, timeout_ms)

    async def invoke_oneway(self, address: str, cmd: RemotingCommand) -> None:
        channel = await self.channel(address)
        channel.invoke_oneway(cmd)

    def connected_addresses(self) -> list[str]:
        return [a for a, ch in self._channels.items() if not ch.closed]

    async def close(self) -> None:
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            channel.close()
        for channel in channels:
            try:
                async with asyncio.timeout(2):
                    await channel.wait_closed()
            except TimeoutError:
                log.warning("channel %s did not close within 2 s", channel)
