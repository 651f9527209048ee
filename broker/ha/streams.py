"""The one asyncio helper both ends of a replication connection share."""

from __future__ import annotations

import asyncio
import struct

from broker.ha.wire import MAX_HELLO_BYTES
from protocol.command import RemotingCommand
from protocol.errors import FrameError
from protocol.frame import FrameDecoder

_FRAME_LENGTH = struct.Struct(">I")


async def read_first_frame(reader: asyncio.StreamReader, timeout_ms: int) -> RemotingCommand:
    """The first remoting frame on `reader` (the hello, or its answer), reading no byte past it (the
    binary stream follows at once); raises `FrameError` for a malformed frame or one over
    `MAX_HELLO_BYTES`, `TimeoutError` after `timeout_ms`, `IncompleteReadError` when the peer
    closes first."""
    async with asyncio.timeout(timeout_ms / 1000):
        prefix = await reader.readexactly(_FRAME_LENGTH.size)
        (length,) = _FRAME_LENGTH.unpack(prefix)
        if length > MAX_HELLO_BYTES:
            raise FrameError(f"first frame of {length} bytes (at most {MAX_HELLO_BYTES})")
        rest = await reader.readexactly(length)
    commands = FrameDecoder(max_frame_bytes=MAX_HELLO_BYTES).feed(prefix + rest)
    if len(commands) != 1:
        raise FrameError("first frame incomplete")
    return commands[0]


class Watchdog:
    """Aborts `transport` once nothing was heard from its peer for `timeout_ms` (`touch()` on every
    read): one timer re-armed every `timeout_ms / 2`, instead of a timeout per read (an ack is read
    per slave write; a timeout context each was the stream's largest cost)."""

    def __init__(self, transport: asyncio.WriteTransport, timeout_ms: int) -> None:
        self._transport, self._timeout_s = transport, timeout_ms / 1000
        self._loop = asyncio.get_running_loop()
        self._heard = self._loop.time()
        self.expired = False
        self._timer = self._loop.call_later(self._timeout_s / 2, self._check)

    def touch(self) -> None:
        self._heard = self._loop.time()

    def _check(self) -> None:
        if self._loop.time() - self._heard > self._timeout_s:
            self.expired = True
            self._transport.abort()
            return
        self._timer = self._loop.call_later(self._timeout_s / 2, self._check)

    def cancel(self) -> None:
        self._timer.cancel()
