"""Server-side TLS on a remoting port, shared by the broker and the name server.

`TlsAcceptor.wrap(inner)` is the protocol of one accepted connection. It waits for the first bytes:
a TLS handshake record (first byte 0x16; a rocketq frame starts with its length, whose first byte is
0 for any frame under 16 MiB) is upgraded with `loop.start_tls` and `inner` then runs on the
decrypted transport; anything else is plaintext, handed to `inner` as is in "permissive" mode and
closed at once, nothing written, in "enforcing" mode. The bytes read to decide are replayed to
whichever takes over, so nothing is lost. After the hand-over this layer is out of the data path.

A connection must send its first byte and finish its handshake within `handshake_timeout_ms`, else
it is aborted; the TLS shutdown at its close is bounded by the same time. `inner.accepted(transport)`
is asked first, before any byte is read (the broker's connection guard counts and bounds the
connection from there), and `inner.abandoned(reason)` is called when the connection ends before
`inner` got it. Works with asyncio's and uvloop's loops (both implement `start_tls` with the same
SSL protocol design)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Coroutine
from typing import Any, Literal, cast

from protocol.channel_protocol import ChannelProtocol

log = logging.getLogger(__name__)
TLS_HANDSHAKE_RECORD = 0x16     # the content type of a TLS record carrying a handshake message
AcceptMode = Literal["permissive", "enforcing"]


class TlsAcceptor:
    """TLS for the connections of one listening port. `mode` "permissive" also serves plaintext,
    "enforcing" closes it; `context` is a server-side `ssl.SSLContext` (`conf.tls.server_context`).
    Owns the connections not yet handed over: `close()` aborts them (the server's shutdown)."""

    def __init__(self, mode: str, context: ssl.SSLContext, handshake_timeout_ms: int) -> None:
        """Raises `ValueError` for a `mode` other than "permissive" or "enforcing"."""
        if mode not in ("permissive", "enforcing"):
            raise ValueError(f"TLS accept mode must be 'permissive' or 'enforcing', not {mode!r}")
        self.mode: AcceptMode = cast(AcceptMode, mode)
        self.context = context
        self.handshake_timeout_ms = handshake_timeout_ms
        self._handshakes: set[asyncio.Task[None]] = set()
        self._waiting: set[SniffingProtocol] = set()      # accepted, first byte not yet read

    def wrap(self, inner: ChannelProtocol) -> asyncio.Protocol:
        """The protocol to give the accepted transport (a server's protocol factory returns it)."""
        return SniffingProtocol(self, inner)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)
        return task

    async def close(self) -> None:
        """Abort the connections still waiting for their first byte, cancel the handshakes in
        progress and wait for them."""
        for sniffer in list(self._waiting):
            sniffer.abort()
        tasks = list(self._handshakes)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class SniffingProtocol(asyncio.Protocol):
    """One accepted connection until `inner` takes it over (see the module docstring)."""

    def __init__(self, acceptor: TlsAcceptor, inner: ChannelProtocol) -> None:
        self._acceptor, self._inner = acceptor, inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = False       # accepted, first byte not yet read
        self._deadline = 0.0        # loop time by which the handshake must be done
        self._expired = False       # the deadline passed (the end of a handshake is then a timeout)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)
        if not self._inner.accepted(transport):
            return
        self._waiting = True
        self._acceptor._waiting.add(self)
        loop = asyncio.get_running_loop()
        timeout_s = self._acceptor.handshake_timeout_ms / 1000
        self._deadline = loop.time() + timeout_s
        self._timer = loop.call_later(timeout_s, self._timed_out)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if not self._waiting or transport is None or not data:
            return          # a refused connection lingering, or bytes after a decision
        self._stop_waiting()
        if data[0] == TLS_HANDSHAKE_RECORD:
            self._upgrade(transport, data)
        elif self._acceptor.mode == "permissive":
            self._cancel_timer()
            transport.set_protocol(self._inner)
            self._inner.connection_made(transport)
            self._inner.data_received(data)
        else:
            self._cancel_timer()
            log.debug("closing plaintext connection from %s: TLS is enforced",
                      transport.get_extra_info("peername"))
            transport.abort()
            self._inner.abandoned("tls_plaintext")

    def eof_received(self) -> bool | None:
        return None         # the peer closed before its first byte: the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._waiting:   # (once the first byte is read, the handshake or `inner` owns the end)
            self._stop_waiting()
            self._inner.abandoned("closed")

    def abort(self) -> None:
        """Close a connection still waiting for its first byte (`inner.abandoned("closed")` follows)."""
        if self._transport is not None:
            self._transport.abort()

    def _stop_waiting(self) -> None:
        self._waiting = False
        self._acceptor._waiting.discard(self)

    def _timed_out(self) -> None:
        """Past the handshake deadline: abort, whether the first byte or the handshake is missing."""
        self._timer = None
        self._expired = True
        transport = self._transport
        if transport is not None and not transport.is_closing():
            log.debug("closing connection from %s: no TLS handshake within %d ms",
                      transport.get_extra_info("peername"), self._acceptor.handshake_timeout_ms)
            if self._waiting:
                self._stop_waiting()
                self._inner.abandoned("tls_handshake")
            transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _upgrade(self, transport: asyncio.Transport, first: bytes) -> None:
        """Start the handshake, then replay `first` (already read) into the SSL protocol."""
        shim = _HandoverShim()
        self._acceptor._spawn(self._handshake(transport, shim))
        # `start_tls` installs its SSL protocol synchronously in the task's first step, which runs
        # before this callback; the SSL protocol takes the bytes before its `connection_made`.
        asyncio.get_running_loop().call_soon(_replay, transport, first, self)

    async def _handshake(self, transport: asyncio.Transport, shim: _HandoverShim) -> None:
        loop = asyncio.get_running_loop()
        remaining_s = max(self._deadline - loop.time(), 0.001)
        try:
            app_transport = await loop.start_tls(
                transport, shim, self._acceptor.context, server_side=True, ssl_handshake_timeout=remaining_s,
                ssl_shutdown_timeout=self._acceptor.handshake_timeout_ms / 1000)   # (a close_notify never answered)
        except asyncio.CancelledError:
            self._cancel_timer()
            transport.abort()
            self._inner.abandoned("closed")
            raise
        except (OSError, ConnectionError, TimeoutError, ValueError) as exc:
            self._cancel_timer()
            log.debug("TLS handshake with %s failed: %s", transport.get_extra_info("peername"), exc)
            transport.abort()
            self._inner.abandoned("tls_handshake")
            return
        self._cancel_timer()
        if app_transport is None or app_transport.is_closing() or transport.is_closing():
            # The connection ended as the handshake completed (asyncio then returns None, uvloop a
            # closed transport): `inner` never gets it, so no `connection_lost` is owed to it.
            transport.abort()
            self._inner.abandoned("tls_handshake" if self._expired else "closed")
            return
        shim.hand_over(self._inner, app_transport)


def _replay(transport: asyncio.Transport, data: bytes, sniffer: SniffingProtocol) -> None:
    """Feed `data` to the transport's protocol now (the SSL protocol `start_tls` installed), with
    the buffered-protocol calls the transport itself would make. Nothing when start_tls failed
    before installing it (the handshake task reports that)."""
    protocol = transport.get_protocol()
    if protocol is sniffer or transport.is_closing():
        return
    if not hasattr(protocol, "buffer_updated"):     # (uvloop's is not an asyncio.BufferedProtocol)
        log.warning("cannot replay a TLS ClientHello into %r: closing the connection", protocol)
        transport.abort()
        return
    protocol = cast(asyncio.BufferedProtocol, protocol)
    view = memoryview(data)
    while view:
        buffer = memoryview(protocol.get_buffer(len(view)))
        count = min(len(buffer), len(view))
        buffer[:count] = view[:count]
        protocol.buffer_updated(count)
        view = view[count:]


class _HandoverShim(asyncio.Protocol):
    """The app protocol during the handshake. The SSL protocol may deliver data, an EOF or the end
    as the handshake completes, before the handshake task resumes to connect `inner` (at most what
    the loop reads before that task's next step); the shim keeps them for `hand_over`, which
    installs `inner` on the TLS transport and replays them. Callbacks the SSL protocol scheduled
    for the shim before the hand-over but that run after it go straight to `inner`."""

    def __init__(self) -> None:
        self._inner: ChannelProtocol | None = None
        self._data: list[bytes] = []
        self._eof = False
        self._lost: tuple[Exception | None] | None = None
        self._writing_paused = False

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        else:
            self._data.append(bytes(data))

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        self._eof = True
        return None         # (a TLS transport closes after an EOF whatever this returns)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._inner.connection_lost(exc)
        else:
            self._lost = (exc,)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()
        self._writing_paused = True

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
        self._writing_paused = False

    def hand_over(self, inner: ChannelProtocol, transport: asyncio.Transport) -> None:
        """`inner` takes over `transport`: connected, then what arrived meanwhile, in order."""
        inner.connection_made(transport)
        transport.set_protocol(inner)
        self._inner = inner
        if self._writing_paused:
            inner.pause_writing()
        data, self._data = self._data, []
        for chunk in data:
            inner.data_received(chunk)
        if self._eof and self._lost is None:
            inner.eof_received()
        if self._lost is not None:
            inner.connection_lost(self._lost[0])
