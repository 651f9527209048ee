"""`LoopbackOnlyProtocol`: the name server's connections in protected mode (`auth.protected`): a
non-loopback peer gets one NO_PERMISSION frame (opaque 0, response flag) saying what to do, and is
closed; loopback peers are served as usual."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from auth.protected import is_loopback
from protocol.channel_protocol import ChannelProtocol
from protocol.codes import CommandFlag, ResponseCode
from protocol.command import RemotingCommand
from protocol.frame import encode_frame_bytes

log = logging.getLogger(__name__)
_LINGER_S = 0.5     # the refused peer's input is read (and dropped) this long, so the frame is not reset away


class LoopbackOnlyProtocol(ChannelProtocol):
    def __init__(self, remark: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._remark = remark

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if is_loopback(host):
            super().connection_made(transport)
            return
        log.warning("refused connection from %s: protected mode (authentication off, listening beyond loopback)",
                    peer)
        writer = cast(asyncio.Transport, transport)     # (uvloop's transports do not subclass it)
        writer.write(encode_frame_bytes(RemotingCommand(code=ResponseCode.NO_PERMISSION, opaque=0,
                                                        flag=CommandFlag.RESPONSE, remark=self._remark)))
        if writer.can_write_eof():
            writer.write_eof()
        asyncio.get_running_loop().call_later(_LINGER_S, writer.abort)
