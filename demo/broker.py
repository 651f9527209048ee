"""The broker the demo talks to: one already listening, or `rocketq broker start` in a subprocess
(`broker.process.BrokerSubprocess`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re

from broker.process import BrokerSubprocess
from client.remoting.remoting_client import split_address

__all__ = ["DEFAULT_ENDPOINT", "BrokerSubprocess", "is_listening"]

log = logging.getLogger(__name__)
DEFAULT_ENDPOINT = "127.0.0.1:10911"
_LISTENING = re.compile(rb"listening on (\S+):(\d+)")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


async def is_listening(address: str, timeout_s: float = 1.0) -> bool:
    """True when a TCP connect to `address` ("host:port") succeeds within `timeout_s`."""
    host, port = split_address(address)
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
