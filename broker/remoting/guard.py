"""`ConnectionGuard`: broker-wide limits that keep one bad client (or ten thousand) from exhausting
the broker's memory or connection slots (issue 12). RocketMQ bounds these with Netty's idle
handler and its fixed thread pools; we bound them explicitly:

- `max_connections`: a connection past it gets one SYSTEM_BUSY frame (opaque 0) whose remark says
  why, and is closed; a rocketq client reports that remark as its `ConnectionClosed` reason.
- `frame_read_timeout_ms`: a frame whose first bytes arrived must complete within it, else the
  connection is aborted (a stalled partial frame holds up to `max_frame_bytes` of memory).
- `channel_expired_timeout_ms`: a connection that sent no valid frame for that long is aborted
  (`HousekeepingService` still expires registered clients without heartbeats as RocketMQ does).
- `max_buffered_bytes`: the bytes held in partial frames plus unsent responses, summed over every
  connection. A connection that holds bytes while the sum is over the cap stops being read
  (TCP back-pressure) until the sum falls to three quarters of the cap. The frame timeout keeps
  running while paused, so stalled senders are still closed and their memory freed.

One log line per refused or closed connection, at most 10 per 10 s (`RateLimitedLog`)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from broker.remoting.ratelimit import RateLimitedLog
from protocol.channel import Channel, ChannelProtocol, CloseHandler, RequestHandler
from protocol.codes import CommandFlag, ResponseCode
from protocol.command import RemotingCommand
from protocol.frame import encode_frame_bytes
from protocol.service import Service

log = logging.getLogger(__name__)

_PAUSE_REASON = "max_buffered_bytes"
_REFUSED_LINGER_S = 0.5     # a refused connection is read (and discarded) this long before closing


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    max_connections: int
    max_buffered_bytes: int
    frame_read_timeout_ms: int
    channel_expired_timeout_ms: int

    @property
    def check_interval_ms(self) -> int:
        """How often deadlines are checked: a tenth of the shorter timeout, within 10..1000 ms."""
        return max(10, min(1_000, self.frame_read_timeout_ms // 10, self.channel_expired_timeout_ms // 10))


class GuardedConnection:
    """What the guard tracks per connection. `held_bytes`: partial frame + unsent responses at the
    last look; `frame_started_ms`: monotonic ms the incomplete frame began (None: none pending)."""

    __slots__ = ("channel", "frame_started_ms", "held_bytes", "last_valid_ms", "protocol", "seen_reads",
                 "valid_reads")

    def __init__(self, protocol: GuardedProtocol, channel: Channel, now_ms: int) -> None:
        self.protocol, self.channel = protocol, channel
        self.held_bytes = 0
        self.frame_started_ms: int | None = None
        self.last_valid_ms = now_ms
        # Reads that decoded a frame, counted without a clock read (the usual read's only cost);
        # the sweep turns a change since it last looked (`seen_reads`) into `last_valid_ms`.
        self.valid_reads = self.seen_reads = 0

    def measure(self) -> int:
        return self.protocol.buffered_bytes + self.channel.transport.get_write_buffer_size()


class ConnectionGuard(Service):
    """Counts live connections, tracks buffered bytes, and closes connections past their deadlines
    (`sweep`, every `limits.check_interval_ms`). `closed` counts closures by reason
    (`refused`, `frame_timeout`, `expired`)."""

    name = "connection-guard"

    def __init__(self, limits: ConnectionLimits, monotonic_ms: Callable[[], int]) -> None:
        super().__init__()
        self.limits = limits
        self._monotonic_ms = monotonic_ms
        self.connections: dict[Channel, GuardedConnection] = {}
        self.buffered_bytes = 0
        self._paused: set[GuardedConnection] = set()
        self.closed: collections.Counter[str] = collections.Counter()
        self._log = RateLimitedLog(log, monotonic_ms)

    # -- called by GuardedProtocol ----------------------------------------------------------------

    def admit(self, transport: asyncio.Transport) -> bool:
        """False (after writing the refusal and closing) when `max_connections` are open."""
        if len(self.connections) < self.limits.max_connections:
            return True
        peer = transport.get_extra_info("peername")
        remark = (f"connection refused: the broker has {len(self.connections)} connections "
                  f"(max_connections {self.limits.max_connections}); retry later")
        transport.write(encode_frame_bytes(RemotingCommand(
            code=ResponseCode.SYSTEM_BUSY, opaque=0, flag=CommandFlag.RESPONSE, remark=remark)))
        # Half-close and keep discarding what the client already sent: closing a socket with unread
        # input sends a reset, which can destroy the refusal frame before the client reads it.
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(_REFUSED_LINGER_S, transport.abort)
        self.closed["refused"] += 1
        self._log.warning("refused connection from %s: %d connections open (max_connections %d)",
                          peer, len(self.connections), self.limits.max_connections)
        return False

    def opened(self, protocol: GuardedProtocol, channel: Channel) -> GuardedConnection:
        conn = GuardedConnection(protocol, channel, self._monotonic_ms())
        self.connections[channel] = conn
        return conn

    def received(self, conn: GuardedConnection, decoded: bool) -> None:
        """After each read: update the byte count, the frame deadline, the last valid frame time, and
        pause this connection when the broker-wide cap is exceeded while it holds bytes."""
        held = conn.measure()
        if not held and not conn.held_bytes:     # the usual read: whole frames, nothing unsent
            if decoded:
                conn.last_valid_ms = self._monotonic_ms()
                conn.frame_started_ms = None
            return
        self.buffered_bytes += held - conn.held_bytes
        conn.held_bytes = held
        partial = conn.protocol.buffered_bytes > 0
        if decoded:
            now_ms = conn.last_valid_ms = self._monotonic_ms()
            conn.frame_started_ms = now_ms if partial else None
        elif partial and conn.frame_started_ms is None:
            conn.frame_started_ms = self._monotonic_ms()
        if held and self.buffered_bytes > self.limits.max_buffered_bytes and conn not in self._paused:
            self._paused.add(conn)
            conn.channel.pause_reading(_PAUSE_REASON)
            self._log.warning("pausing reads from %s: %d bytes buffered on all connections "
                              "(max_buffered_bytes %d)", conn.channel, self.buffered_bytes,
                              self.limits.max_buffered_bytes)

    def lost(self, conn: GuardedConnection) -> None:
        if self.connections.pop(conn.channel, None) is None:
            return
        self.buffered_bytes -= conn.held_bytes
        self._paused.discard(conn)
        self._resume_if_below()

    # -- the sweep --------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Re-measure every connection (unsent responses drain without a read), abort those past a
        deadline, and resume paused reads once the total is back under three quarters of the cap."""
        now_ms = self._monotonic_ms()
        limits = self.limits
        total = 0
        for conn in list(self.connections.values()):
            if conn.valid_reads != conn.seen_reads:     # valid frames came since the last sweep
                conn.seen_reads = conn.valid_reads
                conn.last_valid_ms = now_ms
            conn.held_bytes = conn.measure()
            total += conn.held_bytes
            started = conn.frame_started_ms
            if started is not None and now_ms - started >= limits.frame_read_timeout_ms:
                self._abort(conn, "frame_timeout", "frame not completed within %d ms (%d bytes held)",
                            limits.frame_read_timeout_ms, conn.held_bytes)
            elif now_ms - conn.last_valid_ms >= limits.channel_expired_timeout_ms:
                self._abort(conn, "expired", "no valid frame for %d ms (channel_expired_timeout_ms)",
                            limits.channel_expired_timeout_ms)
        self.buffered_bytes = sum(conn.held_bytes for conn in self.connections.values())
        self._resume_if_below()

    def _abort(self, conn: GuardedConnection, reason: str, message: str, *args: object) -> None:
        self.closed[reason] += 1
        self._log.warning("closing %s: " + message, conn.channel, *args)
        conn.channel.transport.abort()      # frees its buffers now (close() would flush them first)

    def _resume_if_below(self) -> None:
        if self._paused and self.buffered_bytes <= self.limits.max_buffered_bytes * 3 // 4:
            paused, self._paused = self._paused, set()
            for conn in paused:
                conn.channel.resume_reading(_PAUSE_REASON)

    async def run(self) -> None:
        while await self.wait(self.limits.check_interval_ms):
            self.sweep()


class GuardedProtocol(ChannelProtocol):
    """`ChannelProtocol` reporting every connection and read to a `ConnectionGuard`; a refused
    connection never gets a `Channel`."""

    def __init__(self, guard: ConnectionGuard, *, on_request: RequestHandler, on_close: CloseHandler,
                 on_connect: Callable[[Channel], None], max_frame_bytes: int, max_dispatch_per_step: int = 0) -> None:
        super().__init__(on_request=on_request, on_close=on_close, on_connect=on_connect,
                         max_frame_bytes=max_frame_bytes, max_dispatch_per_step=max_dispatch_per_step)
        self._guard = guard
        self._conn: GuardedConnection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit(cast(asyncio.Transport, transport)):
            return
        super().connection_made(transport)
        assert self.channel is not None
        self._conn = self._guard.opened(self, self.channel)

    def _fed(self, decoded: bool) -> None:
        conn = self._conn
        if conn is None:
            return
        if not conn.held_bytes and not self._decoder.buffered_bytes and not self.transport_buffered_bytes():
            # The usual read: whole frames, nothing held before or now. Counting it is all the
            # guard needs (the sweep turns the count into `last_valid_ms`, within one interval).
            if decoded:
                conn.valid_reads += 1
            return
        self._guard.received(conn, decoded)

    def transport_buffered_bytes(self) -> int:
        channel = self.channel
        return channel.transport.get_write_buffer_size() if channel is not None else 0

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._guard.lost(self._conn)
        super().connection_lost(exc)
