"""`Channel`: one TCP connection carrying requests both ways (PROTOCOL.md "Transport").

With `protocol.channel_protocol`, the asyncio modules of `protocol`. A `ChannelProtocol` feeds
received bytes to a `FrameDecoder`; responses resolve the pending future of their opaque, requests
go to `on_request(channel, cmd)` (which must not block: the broker spawns a task). A malformed frame
is answered SYSTEM_ERROR when its opaque is known, logged, and the connection is closed."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

from protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, CommandFlag, ResponseCode
from protocol.command import Buffer, RemotingCommand
from protocol.errors import ConnectionClosed, FrameError, RequestTimeout
from protocol.frame import encode_frame, frame_bytes

log = logging.getLogger(__name__)

RequestHandler = Callable[["Channel", RemotingCommand], None]
CloseHandler = Callable[["Channel"], None]
# Decode up to n more of the frames a connection received (its protocol's decoder): the commands,
# and whether whole frames may still wait.
TakeMore = Callable[[int], tuple[list[RemotingCommand], bool]]
_OPAQUE_MASK = 0xFFFFFFFF
_NOT_RESPONSE_OR_ONEWAY = ~(FLAG_RESPONSE | FLAG_ONEWAY)
_JOIN_BELOW_BYTES = 256 * 1024
_BACKLOG = "backlog"            # the read-pause reason while received commands wait their turn


class Channel:
    """Send and receive commands on one transport. `invoke` awaits the response of a request;
    `invoke_oneway` and `send` only write. `remote_address` is the peer's "ip:port".

    `max_dispatch_per_step` (0: no bound) bounds how many received commands are handled in one
    event-loop step: the rest wait their turn in later steps, in order, and the connection is not
    read meanwhile; its protocol decodes them only when their turn comes (`take_more`). The
    broker sets it, so that a burst of pipelined requests on one connection lets the loop turn to
    its other work between chunks (other connections, finished fsync rounds) and sends each
    chunk's responses before handling the next. Measured with one
    producer keeping 64 sends in flight (bench.peers send_one, 3 interleaved runs): ASYNC_FLUSH
    47-52k to 58-65k msg/s, SYNC_FLUSH 22-28k to 29-35k, the broker's loop busy where it used
    to wait for the client.

    `pause_reading(reason)` stops both reading and handling: commands already read wait, in order,
    until every reason is resumed (a connection that does not read its responses must not get
    more of them computed from requests it pipelined earlier). `on_unsent`, when set, is called
    after a write that left bytes in the transport's buffer (the broker counts them). `signer`,
    when set, signs each request this side sends (`invoke`, `invoke_oneway`) just before it is
    written: a client with credentials (`protocol.signing`); responses are never signed."""

    def __init__(self, transport: asyncio.Transport, *, on_request: RequestHandler | None = None,
                 on_close: CloseHandler | None = None, max_dispatch_per_step: int = 0) -> None:
        if max_dispatch_per_step < 0:
            raise ValueError(f"max_dispatch_per_step must be 0 (no bound) or positive, got {max_dispatch_per_step}")
        self.transport = transport
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        self.remote_address = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.local_address = f"{local[0]}:{local[1]}" if local else "?"
        self.on_request = on_request
        self.on_close = on_close
        self.pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._deadlines: dict[int, tuple[float, int, int]] = {}   # opaque -> (loop time, code, timeout_ms)
        self._sweep: asyncio.TimerHandle | None = None            # `_expire`, armed for `_sweep_at`
        self._sweep_at = math.inf
        self.attributes: dict[str, Any] = {}   # owners keep per-connection state here (client id…)
        self._next_opaque = 0
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._aborted = False                    # `abort` was called: nothing more is written
        self._closed_event = asyncio.Event()
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._outbox: list[Buffer] = []         # frames written at the end of this loop step
        self._outbox_bytes = 0
        self._corked = False                     # a frame was written this step; queue the rest
        self.write_at_once_bytes: int | None = None     # a frame this large is never queued (None: any is)
        self._read_pauses: set[str] = set()      # why reads are paused (several owners may pause)
        self._close_remark: str | None = None    # remark of an unsolicited error frame (a refusal)
        self._dispatch_limit = max_dispatch_per_step
        self._backlog: list[RemotingCommand] = []   # received, waiting their turn (over the limit, or held)
        self._backlog_scheduled = False          # `_dispatch_backlog` is due in a later loop step
        self._more = False                       # whole frames wait undecoded (`take_more` gets them)
        self.take_more: TakeMore | None = None
        self.on_unsent: Callable[[Channel], None] | None = None
        self.signer: Callable[[RemotingCommand], None] | None = None

    def __repr__(self) -> str:
        return f"Channel({self.remote_address})"

    @property
    def closed(self) -> bool:
        """True once the connection is lost, or aborted (`abort`: before the loss is reported)."""
        return self._closed or self._aborted

    def _opaque(self) -> int:
        self._next_opaque = (self._next_opaque + 1) & _OPAQUE_MASK
        while self._next_opaque in self.pending:
            self._next_opaque = (self._next_opaque + 1) & _OPAQUE_MASK
        return self._next_opaque

    def send(self, cmd: RemotingCommand) -> None:
        """Write one command; raises `ConnectionClosed` if the channel is closed.

        The first frame of an event-loop step is written at once (latency); frames sent later in
        the same step are queued and leave together in one `write` at its end (a syscall per small
        response was the top cost under load), unless at least `write_at_once_bytes` long: then it
        leaves at once with those queued before it (a client's large request, so the peer starts
        on it while this step goes on). Frames sent while a read's commands are handled
        leave in one write once they all are. A large body is written uncopied."""
        if self._closed or self._aborted:
            raise ConnectionClosed(self.remote_address)
        data = frame_bytes(cmd, _JOIN_BELOW_BYTES)
        if data is None:            # a large body: written uncopied, behind what is queued
            self.flush()
            self.transport.writelines(encode_frame(cmd))
            self._wrote()
            return
        size = len(data)
        if self._corked:
            at_once = self.write_at_once_bytes
            if at_once is not None and size >= at_once:     # not held back to the step's end
                self._outbox.append(data)
                self.flush()
                self._corked = True
                return
            self._outbox.append(data)
            self._outbox_bytes += size
            if self._outbox_bytes > _JOIN_BELOW_BYTES:
                self.flush()
            return
        self._corked = True
        self._loop.call_soon(self.flush)
        transport = self.transport
        transport.write(data)
        if self.on_unsent is not None and transport.get_write_buffer_size():     # (`_wrote`, inline)
            self.on_unsent(self)

    def flush(self) -> None:
        """Write what `send` queued during this loop step (harmless when nothing is queued)."""
        self._corked = False
        if not self._outbox:
            return
        data = b"".join(self._outbox)
        self._outbox.clear()
        self._outbox_bytes = 0
        if not self._closed and not self._aborted:
            self.transport.write(data)
            self._wrote()

    def _wrote(self) -> None:
        on_unsent = self.on_unsent
        if on_unsent is not None and self.transport.get_write_buffer_size():
            on_unsent(self)

    @property
    def unsent_bytes(self) -> int:
        """Response bytes written but not yet taken by the peer: the transport's buffer and the
        frames queued for the end of this loop step."""
        return self._outbox_bytes + self.transport.get_write_buffer_size()

    @property
    def backlog_bytes(self) -> int:
        """Body bytes of the commands read but waiting their turn (0 when none wait)."""
        return sum(len(cmd.body) for cmd in self._backlog) if self._backlog else 0

    @property
    def write_paused(self) -> bool:
        """The transport's write buffer is above its high-water mark (`drain` would wait)."""
        return self._write_paused

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if not self._write_paused or self._closed:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    async def invoke(self, cmd: RemotingCommand, timeout_ms: int) -> RemotingCommand:
        """Send a request and await its response; raises `RequestTimeout` (at its deadline, to
        the loop's timer resolution) or `ConnectionClosed`.

        Deadlines are checked by one sweep per channel (`_expire`), not a timer per request: a
        uvloop timer armed and cancelled for every request cost ~3 µs, a sixth of a send's
        client CPU. The sweep is armed for the earliest deadline and re-armed only when a request
        has an earlier deadline than the one it waits for, so a steady stream of requests with
        the same timeout arms it about once per timeout."""
        opaque = cmd.opaque = self._opaque()
        cmd.flag &= _NOT_RESPONSE_OR_ONEWAY
        loop = self._loop
        future: asyncio.Future[RemotingCommand] = loop.create_future()
        self.pending[opaque] = future
        deadline = loop.time() + timeout_ms / 1000
        self._deadlines[opaque] = (deadline, cmd.code, timeout_ms)
        if deadline < self._sweep_at:
            self._arm_sweep(deadline)
        try:
            if self.signer is not None:
                self.signer(cmd)
            self.send(cmd)
            return await future
        finally:
            self.pending.pop(opaque, None)
            del self._deadlines[opaque]
            if self._closed and not self._deadlines and self._sweep is not None:
                self._arm_sweep(math.inf)     # a closed channel keeps no timer (nor itself alive)

    def _arm_sweep(self, when: float) -> None:
        """(Re)arm `_expire` for loop time `when`; `math.inf` only disarms it."""
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = when
        self._sweep = self._loop.call_at(when, self._expire) if when != math.inf else None

    def _expire(self) -> None:
        """The timeout sweep: fail each request past its deadline with `RequestTimeout` (its
        `invoke` drops it from `pending`), then re-arm for the earliest deadline left."""
        self._sweep, self._sweep_at = None, math.inf
        now = self._loop.time()
        next_at = math.inf
        for opaque, (deadline, code, timeout_ms) in self._deadlines.items():
            if deadline <= now:
                future = self.pending.get(opaque)
                if future is not None and not future.done():   # set_exception only schedules callbacks
                    future.set_exception(RequestTimeout(self.remote_address, code, timeout_ms))
            elif deadline < next_at:
                next_at = deadline
        if next_at != math.inf:
            self._arm_sweep(next_at)

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = self._opaque()
        cmd.flag = (cmd.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE
        if self.signer is not None:
            self.signer(cmd)
        self.send(cmd)

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what is unsent (its memory is freed at once). `closed` is True and
        `send` raises `ConnectionClosed` from here on, though the loss (`on_close`, pending
        requests failing) is reported in a later loop step, as for any loss: a transport refuses
        writes once aborted."""
        if self._closed or self._aborted:
            return
        self._aborted = True
        self._outbox.clear()
        self._outbox_bytes = 0
        self.transport.abort()

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    def pause_reading(self, reason: str) -> None:
        """Stop reading from the peer (TCP back-pressure), and handling the commands already read,
        until every `reason` given is resumed; several owners (in-flight cap, unread responses,
        broker-wide buffer cap) pause independently."""
        if not self._read_pauses and not self._closed:
            self.transport.pause_reading()
        self._read_pauses.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason not in self._read_pauses:
            return
        self._read_pauses.discard(reason)
        if self._closed:
            return
        if not self._read_pauses:
            self.transport.resume_reading()
        elif (self._backlog or self._more) and not self._held():   # only the backlog's own pause is left
            self._schedule_backlog()

    def _held(self) -> bool:
        """Handling is paused: some owner other than the backlog itself paused this channel."""
        pauses = self._read_pauses
        return len(pauses) > 1 or (bool(pauses) and _BACKLOG not in pauses)

    @property
    def reading_paused(self) -> bool:
        return bool(self._read_pauses)

    # -- called by ChannelProtocol -------------------------------------------------------------

    def _received(self, commands: list[RemotingCommand], more: bool = False) -> None:
        """`commands` were read; `more`: further whole frames wait undecoded (see `take_more`)."""
        limit = self._dispatch_limit
        if self._backlog or self._read_pauses or more or (limit and len(commands) > limit):
            started = not self._backlog and not self._more
            self._backlog += commands
            self._more = more
            if started:
                self.pause_reading(_BACKLOG)
                self._dispatch_backlog()
            return
        self._dispatch_corked(commands)

    def _schedule_backlog(self) -> None:
        if not self._backlog_scheduled:
            self._backlog_scheduled = True
            self._loop.call_soon(self._dispatch_backlog)

    def _dispatch_backlog(self) -> None:
        """Handle the next `max_dispatch_per_step` waiting commands (all when 0); schedule the
        rest for the next loop step, or read again once none is left. Nothing while held: the
        `resume_reading` that ends the hold schedules this again."""
        self._backlog_scheduled = False
        if self._closed or self._held():    # (a lost channel's backlog: handled by `_lost`)
            return
        backlog, limit = self._backlog, self._dispatch_limit
        if self._more and self.take_more is not None and len(backlog) < limit:
            fresh, self._more = self.take_more(limit - len(backlog))
            backlog += fresh
        limit = limit or len(backlog)
        commands = backlog[:limit]
        del backlog[:limit]
        if backlog or self._more:
            self._schedule_backlog()
        else:
            self.resume_reading(_BACKLOG)
        if commands:
            self._dispatch_corked(commands)

    def _hold_back(self, commands: list[RemotingCommand]) -> None:
        """A pause came while a read's commands were handled: the rest wait, ahead of the backlog."""
        self._backlog[:0] = commands
        self._read_pauses.add(_BACKLOG)     # (the transport is already paused by the hold)

    def _dispatch_corked(self, commands: list[RemotingCommand]) -> None:
        # Responses written while these commands are handled (the requests answered at once)
        # leave together in one write when they are done, with no callback to schedule.
        corked, self._corked = self._corked, True
        try:
            self._dispatch(commands)
        finally:
            if not corked:
                self.flush()

    def _dispatch(self, commands: list[RemotingCommand]) -> None:
        for index, cmd in enumerate(commands):
            if cmd.flag & FLAG_RESPONSE:
                future = self.pending.get(cmd.opaque)
                if future is not None and not future.done():
                    future.set_result(cmd)
                else:
                    if cmd.code != ResponseCode.SUCCESS and cmd.remark:
                        self._close_remark = cmd.remark    # e.g. a refused connection says why
                    log.debug("%s: response for unknown opaque %d (late or duplicate)", self, cmd.opaque)
            elif self.on_request is not None:
                self.on_request(self, cmd)
                if self._read_pauses and self._held() and not self._closed:
                    rest = commands[index + 1:]
                    if rest:
                        self._hold_back(rest)
                    return

    def _frame_error(self, err: FrameError) -> None:
        """Answer a malformed frame (SYSTEM_ERROR when its opaque is known) and close; the
        protocol logs it (`ChannelProtocol.log_frame_error`)."""
        if self.closed:
            return
        self.flush()
        if err.opaque is not None:
            self.transport.writelines(encode_frame(RemotingCommand(
                code=ResponseCode.SYSTEM_ERROR, opaque=err.opaque, flag=CommandFlag.RESPONSE,
                remark=f"protocol error: {err}; closing the connection")))
        self.transport.close()

    def _lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._more and self.take_more is not None:     # read before the loss, not yet decoded
            self._backlog += self.take_more(0)[0]
        self._more = False
        if self._backlog:       # received before the loss: handled as every read is (no answer)
            backlog, self._backlog = self._backlog, []
            try:
                self._dispatch(backlog)
            except Exception:   # the pending requests must still fail and `on_close` still run
                log.exception("%s: handling %d commands received before the connection was lost failed",
                              self, len(backlog))
        reason = self._close_remark or str(exc or "connection closed")
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ConnectionClosed(self.remote_address, reason))
        self._release_drain_waiters()
        self._closed_event.set()
        if self.on_close is not None:
            self.on_close(self)

    def _pause_writing(self) -> None:
        self._write_paused = True

    def _resume_writing(self) -> None:
        self._write_paused = False
        self._release_drain_waiters()

    def _release_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
