"""`Dispatcher`: runs one owned task per inbound request and writes its response.

A `ResponseError` becomes a response with its code and remark; any other exception becomes
SYSTEM_ERROR (logged with the request code); an unknown code is answered
REQUEST_CODE_NOT_SUPPORTED. One-way requests get no response."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from broker.remoting.context import RequestContext
from protocol.channel import Channel
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import ConnectionClosed, ResponseError

log = logging.getLogger(__name__)


# A request handler: a processor's bound method for one request code.
Handler = Callable[[RequestContext, RemotingCommand], Awaitable[RemotingCommand | None]]


Observer = Callable[[int, int, float], None]   # (request code, response code, seconds)


class Dispatcher:
    """`max_in_flight_per_channel` bounds one connection's memory: past it the broker stops reading
    that connection (TCP back-pressure) until half of its requests have been answered."""

    def __init__(self, handlers: dict[int, Handler], observe: Observer | None = None,
                 max_in_flight_per_channel: int = 4096) -> None:
        self._handlers = handlers
        self._observe = observe
        self._tasks: set[asyncio.Task[None]] = set()
        self._max_in_flight = max_in_flight_per_channel
        self._per_channel: dict[Channel, int] = {}
        self._paused: set[Channel] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def on_request(self, channel: Channel, request: RemotingCommand) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(channel, request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        count = self._per_channel.get(channel, 0) + 1
        self._per_channel[channel] = count
        if count >= self._max_in_flight and channel not in self._paused and not channel.closed:
            log.warning("%s has %d requests in flight; pausing reads from it", channel, count)
            self._paused.add(channel)
            channel.pause_reading("in-flight")

    def _done(self, channel: Channel) -> None:
        count = self._per_channel[channel] - 1
        if count:
            self._per_channel[channel] = count
        else:
            del self._per_channel[channel]
        if channel in self._paused and count <= self._max_in_flight // 2:
            self._paused.discard(channel)
            channel.resume_reading("in-flight")

    async def _handle(self, channel: Channel, request: RemotingCommand) -> None:
        try:
            await self._answer(channel, request)
        finally:
            self._done(channel)

    async def _answer(self, channel: Channel, request: RemotingCommand) -> None:
        started = time.perf_counter()
        handler = self._handlers.get(request.code)
        response: RemotingCommand | None
        if handler is None:
            response = request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                        remark=f"request code {request.code} is not supported by this broker")
        else:
            ctx = RequestContext(channel, channel.remote_address, int(time.monotonic() * 1000))
            try:
                response = await handler(ctx, request)
            except ResponseError as err:
                response = request.response(err.code, remark=err.remark)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("request code %d from %s failed", request.code, channel)
                response = request.response(ResponseCode.SYSTEM_ERROR,
                                            remark=f"internal error: {exc.__class__.__name__}: {exc}")
        if self._observe is not None:
            self._observe(request.code, response.code if response is not None else 0,
                          time.perf_counter() - started)
        if response is None or request.is_oneway or channel.closed:
            return
        try:
            channel.send(response)
            await channel.drain()
        except ConnectionClosed:
            pass

    async def drain(self, timeout_ms: int) -> None:
        """Wait for in-flight requests for at most `timeout_ms`, then cancel the rest."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_ms / 1000)
        if pending:
            log.warning("cancelling %d requests still running after %d ms", len(pending), timeout_ms)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
