"""`ConnectionGuard`: broker-wide limits that keep one bad client (or ten thousand) from exhausting
the broker's memory or connection slots (issues 12 and 35). RocketMQ bounds these with Netty's idle
handler, its fixed thread pools and Netty's write-buffer water marks; we bound them explicitly:

- `protected_remark` (protected mode, `auth.protected`): a connection from a non-loopback peer
  gets one NO_PERMISSION frame (opaque 0) with that remark, and is closed.
- `max_connections` / `max_connections_per_address`: a connection past either gets one SYSTEM_BUSY
  frame (opaque 0) whose remark says why, and is closed; a rocketq client reports that remark as
  its `ConnectionClosed` reason. The per-address cap counts connections by peer IP (loopback too).
  With TLS on, connections still waiting for their first byte or TLS handshake (`pending`, bounded
  in time by `tls.handshake_timeout_ms`) count too; a refused TLS client sees its handshake fail.
- `frame_read_timeout_ms`: a frame whose first bytes arrived must complete within it, else the
  connection is aborted (a stalled partial frame holds up to `max_frame_bytes` of memory).
- `channel_expired_timeout_ms`: a connection that sent no valid frame for that long is aborted
  (`HousekeepingService` still expires registered clients without heartbeats as RocketMQ does).
- Unsent bytes of a connection: its partial frame, its responses not yet taken by the peer (the
  transport's write buffer and the channel's outbox), the requests it sent that wait unhandled
  (the channel's backlog) or unanswered (the dispatcher's in-flight ones). Past
  `max_unsent_bytes_per_connection` the connection is neither read nor are its read requests
  handled until it drains below a quarter of that (the transport's write water marks; the
  dispatcher pauses it), so a peer that never reads its pull responses holds about one bound's
  worth, not every response it asked for. Past `close_unsent_bytes_per_connection`, or holding
  unsent responses that made no progress for `write_stall_timeout_ms`, it is aborted.
- `max_buffered_bytes`: the unsent bytes summed over every connection. A connection that holds
  bytes while the sum is over the cap (measured after each read and after each write that left
  bytes unsent) stops being read and handled until the sum falls to three quarters of the cap.

After closed connections freed much memory, the guard returns it to the OS (`release_freed_memory`).
Every line bad input can cause goes through one `RateLimitedLog` (10 lines per 10 s per kind, and
a periodic "N similar lines suppressed" summary)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from auth.protected import is_loopback
from broker.remoting.memory import release_freed_memory
from broker.remoting.ratelimit import RateLimitedLog
from protocol.channel import Channel, CloseHandler, RequestHandler
from protocol.channel_protocol import ChannelProtocol
from protocol.codes import CommandFlag, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import FrameError
from protocol.frame import encode_frame_bytes
from protocol.service import Service

log = logging.getLogger(__name__)

_PAUSE_REASON = "max_buffered_bytes"
_UNREAD = "unread responses"     # the pause reason while the transport's write buffer is over its high mark
_REFUSED_LINGER_S = 0.5     # a refused connection is read (and discarded) this long before closing
_TRIM_AFTER_FREED_BYTES = 16 * 1024 * 1024     # closed connections freed this much: trim the heap
CLOSE_REASONS = ("refused", "refused_per_address", "frame_timeout", "expired", "unsent_limit", "write_stall",
                 "protected_mode", "tls_plaintext", "tls_handshake")
InFlightBytes = Callable[[Channel], int]        # request bytes the dispatcher holds for a channel


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    max_connections: int
    max_buffered_bytes: int
    frame_read_timeout_ms: int
    channel_expired_timeout_ms: int
    max_connections_per_address: int = 0          # 0: no per-address cap
    max_unsent_bytes_per_connection: int = 4 << 20
    close_unsent_bytes_per_connection: int = 64 << 20
    write_stall_timeout_ms: int = 60_000
    protected_remark: str | None = None            # protected mode: non-loopback peers get this and are closed

    @property
    def check_interval_ms(self) -> int:
        """How often deadlines are checked: a tenth of the shortest timeout, within 10..1000 ms."""
        return max(10, min(1_000, self.frame_read_timeout_ms // 10, self.channel_expired_timeout_ms // 10,
                           self.write_stall_timeout_ms // 10))


class GuardedConnection:
    """What the guard tracks per connection. `held_bytes`: its unsent bytes at the last look;
    `frame_started_ms`: monotonic ms the incomplete frame began (None: none pending);
    `write_buffered`: the transport's write buffer at the last sweep, `stalled_since_ms` since when it
    has not shrunk (None: empty, or shrinking)."""

    __slots__ = ("address", "channel", "frame_started_ms", "held_bytes", "last_valid_ms", "protocol",
                 "seen_reads", "stalled_since_ms", "valid_reads", "write_buffered")

    def __init__(self, protocol: GuardedProtocol, channel: Channel, address: str, now_ms: int) -> None:
        self.protocol, self.channel, self.address = protocol, channel, address
        self.held_bytes = self.write_buffered = 0
        self.frame_started_ms: int | None = None
        self.stalled_since_ms: int | None = None
        self.last_valid_ms = now_ms
        # Reads that decoded a frame, counted without a clock read (the usual read's only cost);
        # the sweep turns a change since it last looked (`seen_reads`) into `last_valid_ms`.
        self.valid_reads = self.seen_reads = 0


class ConnectionGuard(Service):
    """Counts live connections (in all and per peer address), tracks their unsent bytes, and
    closes connections past their deadlines or bounds (`sweep`, every `limits.check_interval_ms`).
    `closed` counts closures by reason (`CLOSE_REASONS`)."""

    name = "connection-guard"

    def __init__(self, limits: ConnectionLimits, monotonic_ms: Callable[[], int]) -> None:
        super().__init__()
        self.limits = limits
        self._monotonic_ms = monotonic_ms
        self.connections: dict[Channel, GuardedConnection] = {}
        self.per_address: collections.Counter[str] = collections.Counter()
        self.pending = 0        # accepted, no channel yet: waiting for the first byte or the TLS handshake
        self.buffered_bytes = 0
        self._paused: set[GuardedConnection] = set()
        self._freed_bytes = 0                   # held by connections closed since the last trim
        self._in_flight_bytes: InFlightBytes | None = None
        self.closed: collections.Counter[str] = collections.Counter()
        self.log = RateLimitedLog(log, monotonic_ms)

    def count_in_flight(self, in_flight_bytes: InFlightBytes) -> None:
        """Count the request bytes the dispatcher holds for a channel as that channel's."""
        self._in_flight_bytes = in_flight_bytes

    def measure(self, conn: GuardedConnection) -> int:
        """The connection's unsent bytes now (see the module docstring)."""
        channel = conn.channel
        held = conn.protocol.buffered_bytes + channel.unsent_bytes + channel.backlog_bytes
        if self._in_flight_bytes is not None:
            held += self._in_flight_bytes(channel)
        return held

    # -- called by GuardedProtocol ----------------------------------------------------------------

    def admit(self, transport: asyncio.Transport) -> bool:
        """False (after writing the refusal and closing) when `max_connections` are open (pending
        ones included), or `max_connections_per_address` from the peer's address."""
        limits = self.limits
        peer = transport.get_extra_info("peername")
        address = _host(peer)
        if limits.protected_remark is not None and not is_loopback(address):
            self._refuse(transport, "protected_mode", limits.protected_remark, ResponseCode.NO_PERMISSION)
            self.log.warning("refused connection from %s: protected mode (authentication off, listening beyond "
                             "loopback)", peer)
            return False
        count = len(self.connections) + self.pending
        if count >= limits.max_connections:
            self._refuse(transport, "refused", f"connection refused: the broker has {count} "
                         f"connections (max_connections {limits.max_connections}); retry later")
            self.log.warning("refused connection from %s: %d connections open (max_connections %d)",
                             peer, count, limits.max_connections)
            return False
        per_address = limits.max_connections_per_address
        if per_address and self.per_address[address] >= per_address:
            self._refuse(transport, "refused_per_address", f"connection refused: {address} has "
                         f"{self.per_address[address]} connections to the broker (max_connections_per_address "
                         f"{per_address}); retry later")
            self.log.warning("refused connection from %s: %d connections from that address "
                             "(max_connections_per_address %d)", peer, self.per_address[address], per_address)
            return False
        return True

    def _refuse(self, transport: asyncio.Transport, reason: str, remark: str,
                code: ResponseCode = ResponseCode.SYSTEM_BUSY) -> None:
        transport.write(encode_frame_bytes(RemotingCommand(code=code, opaque=0, flag=CommandFlag.RESPONSE,
                                                           remark=remark)))
        # Half-close and keep discarding what the client already sent: closing a socket with unread
        # input sends a reset, which can destroy the refusal frame before the client reads it.
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(_REFUSED_LINGER_S, transport.abort)
        self.closed[reason] += 1

    def accepted(self, transport: asyncio.Transport) -> str | None:
        """A connection that gets its channel later (TLS): `admit` it and count it as pending; its
        address, or None when refused. `opened(..., pending=address)` or `abandoned` follows."""
        if not self.admit(transport):
            return None
        address = _host(transport.get_extra_info("peername"))
        self.pending += 1
        self.per_address[address] += 1
        return address

    def abandoned(self, address: str, reason: str) -> None:
        """A pending connection closed before it got a channel (`reason`: see `CLOSE_REASONS`)."""
        self.pending -= 1
        self._drop_address(address)
        if reason in CLOSE_REASONS:
            self.closed[reason] += 1
            self.log.warning("closed connection from %s before it was open: %s", address, reason)

    def opened(self, protocol: GuardedProtocol, channel: Channel, *, pending: str | None = None) -> GuardedConnection:
        """Track a connection that has its channel (`pending`: its address, counted by `accepted`)."""
        address = pending if pending is not None else _host(channel.transport.get_extra_info("peername"))
        conn = GuardedConnection(protocol, channel, address, self._monotonic_ms())
        self.connections[channel] = conn
        if pending is not None:
            self.pending -= 1
        else:
            self.per_address[address] += 1
        return conn

    def received(self, conn: GuardedConnection, decoded: bool) -> None:
        """After each read: update the byte count, the frame deadline, the last valid frame time, and
        pause this connection when the broker-wide cap is exceeded while it holds bytes."""
        held = self.measure(conn)
        if not held and not conn.held_bytes:     # the usual read: whole frames, nothing unsent
            if decoded:
                conn.last_valid_ms = self._monotonic_ms()
                conn.frame_started_ms = None
            return
        self._account(conn, held)
        partial = conn.protocol.partial_bytes > 0
        if decoded:
            now_ms = conn.last_valid_ms = self._monotonic_ms()
            conn.frame_started_ms = now_ms if partial else None
        elif partial and conn.frame_started_ms is None:
            conn.frame_started_ms = self._monotonic_ms()
        if held:
            self._pause_if_over(conn)

    def unsent(self, conn: GuardedConnection) -> None:
        """After a write that left bytes unsent: count them; abort the connection past
        `close_unsent_bytes_per_connection`, pause it while the broker-wide sum is over the cap."""
        held = self.measure(conn)
        self._account(conn, held)
        if held >= self.limits.close_unsent_bytes_per_connection:
            self._abort(conn, "unsent_limit", "%d bytes unsent (close_unsent_bytes_per_connection %d)",
                        held, self.limits.close_unsent_bytes_per_connection)
            return
        self._pause_if_over(conn)

    def drained(self, conn: GuardedConnection) -> None:
        """The connection's write buffer fell below its low-water mark: count it again, and resume
        reads paused for the broker-wide cap once the sum is back under three quarters of it."""
        self._account(conn, self.measure(conn))
        self._resume_if_below()

    def lost(self, conn: GuardedConnection) -> None:
        if self.connections.pop(conn.channel, None) is None:
            return
        self._drop_address(conn.address)
        self.buffered_bytes -= conn.held_bytes
        self._freed_bytes += conn.held_bytes
        self._paused.discard(conn)
        self._resume_if_below()

    def _drop_address(self, address: str) -> None:
        self.per_address[address] -= 1
        if not self.per_address[address]:
            del self.per_address[address]

    def _account(self, conn: GuardedConnection, held: int) -> None:
        self.buffered_bytes += held - conn.held_bytes
        conn.held_bytes = held

    def _pause_if_over(self, conn: GuardedConnection) -> None:
        if self.buffered_bytes > self.limits.max_buffered_bytes and conn not in self._paused:
            self._paused.add(conn)
            conn.channel.pause_reading(_PAUSE_REASON)
            self.log.warning("pausing reads from %s: %d bytes buffered on all connections "
                             "(max_buffered_bytes %d)", conn.channel, self.buffered_bytes,
                             self.limits.max_buffered_bytes)

    # -- the sweep --------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Re-measure every connection (unsent responses drain without a read), abort those past a
        deadline or bound, resume paused reads once the total is back under three quarters of the
        cap, return freed memory to the OS after large frees, and report suppressed log lines."""
        now_ms = self._monotonic_ms()
        for conn in list(self.connections.values()):
            if conn.valid_reads != conn.seen_reads:     # valid frames came since the last sweep
                conn.seen_reads = conn.valid_reads
                conn.last_valid_ms = now_ms
            conn.held_bytes = self.measure(conn)
            self._check(conn, now_ms)
        self.buffered_bytes = sum(conn.held_bytes for conn in self.connections.values())
        self._resume_if_below()
        if self._freed_bytes >= _TRIM_AFTER_FREED_BYTES:
            self._freed_bytes = 0
            release_freed_memory()
        self.log.flush()

    def _check(self, conn: GuardedConnection, now_ms: int) -> None:
        limits = self.limits
        write_buffered = conn.channel.transport.get_write_buffer_size()
        if not write_buffered or write_buffered < conn.write_buffered:
            conn.stalled_since_ms = None            # empty, or the peer took some since the last look
        elif conn.stalled_since_ms is None:
            conn.stalled_since_ms = now_ms
        conn.write_buffered = write_buffered
        started, stalled = conn.frame_started_ms, conn.stalled_since_ms
        if started is not None and now_ms - started >= limits.frame_read_timeout_ms:
            self._abort(conn, "frame_timeout", "frame not completed within %d ms (%d bytes held)",
                        limits.frame_read_timeout_ms, conn.held_bytes)
        elif now_ms - conn.last_valid_ms >= limits.channel_expired_timeout_ms:
            self._abort(conn, "expired", "no valid frame for %d ms (channel_expired_timeout_ms)",
                        limits.channel_expired_timeout_ms)
        elif conn.held_bytes >= limits.close_unsent_bytes_per_connection:
            self._abort(conn, "unsent_limit", "%d bytes unsent (close_unsent_bytes_per_connection %d)",
                        conn.held_bytes, limits.close_unsent_bytes_per_connection)
        elif stalled is not None and now_ms - stalled >= limits.write_stall_timeout_ms:
            self._abort(conn, "write_stall", "%d response bytes not read for %d ms (write_stall_timeout_ms)",
                        write_buffered, limits.write_stall_timeout_ms)

    def _abort(self, conn: GuardedConnection, reason: str, message: str, *args: object) -> None:
        self.closed[reason] += 1
        self.log.warning("closing %s: " + message, conn.channel, *args)
        conn.channel.abort()        # frees its buffers now (close() would flush them first)

    def _resume_if_below(self) -> None:
        if self._paused and self.buffered_bytes <= self.limits.max_buffered_bytes * 3 // 4:
            paused, self._paused = self._paused, set()
            for conn in paused:
                conn.channel.resume_reading(_PAUSE_REASON)

    async def run(self) -> None:
        while await self.wait(self.limits.check_interval_ms):
            self.sweep()


def _host(peer: object) -> str:
    """The IP of a peername tuple ("?" when there is none, e.g. an in-process transport)."""
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


class GuardedProtocol(ChannelProtocol):
    """`ChannelProtocol` reporting every connection, read and backed-up write to a
    `ConnectionGuard`; a refused connection never gets a `Channel`. The transport's write water
    marks are the guard's per-connection bound (high) and a quarter of it (low)."""

    def __init__(self, guard: ConnectionGuard, *, on_request: RequestHandler, on_close: CloseHandler,
                 on_connect: Callable[[Channel], None], max_frame_bytes: int, max_dispatch_per_step: int = 0) -> None:
        super().__init__(on_request=on_request, on_close=on_close, on_connect=on_connect,
                         max_frame_bytes=max_frame_bytes, max_dispatch_per_step=max_dispatch_per_step)
        self._guard = guard
        self._conn: GuardedConnection | None = None
        self._pending: str | None = None     # the address `accepted` counted (TLS), until opened

    def accepted(self, transport: asyncio.Transport) -> bool:
        self._pending = self._guard.accepted(transport)
        return self._pending is not None

    def abandoned(self, reason: str) -> None:
        if self._pending is not None:
            self._guard.abandoned(self._pending, reason)
            self._pending = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pending, self._pending = self._pending, None
        if pending is None and not self._guard.admit(cast(asyncio.Transport, transport)):
            return
        high = self._guard.limits.max_unsent_bytes_per_connection
        with contextlib.suppress(NotImplementedError):     # (bench.inproc's transport has no buffer)
            cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=high, low=high // 4)
        super().connection_made(transport)
        channel = self.channel
        assert channel is not None
        conn = self._conn = self._guard.opened(self, channel, pending=pending)
        channel.on_unsent = lambda _: self._guard.unsent(conn)

    def log_frame_error(self, channel: Channel, err: FrameError) -> None:
        self._guard.log.warning("%s: protocol error, closing connection: %s", channel, err)

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

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.channel is not None:
            self.channel.pause_reading(_UNREAD)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.channel is not None:
            self.channel.resume_reading(_UNREAD)
        if self._conn is not None:
            self._guard.drained(self._conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._guard.lost(self._conn)
            self._conn = None
        super().connection_lost(exc)
