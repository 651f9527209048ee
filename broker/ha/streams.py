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
