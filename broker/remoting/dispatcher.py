"""`Dispatcher`: runs each inbound request's handler and writes its response.

A handler answers in one of three ways. A *synchronous* answer (a `RemotingCommand`, or None for
no response) is written in the same loop step, with no task: the hot requests (a send in
ASYNC_FLUSH, a pull that finds messages, an offset commit, a heartbeat) answer this way, because a
task per request was the largest single cost of a one-at-a-time send. A *future* (a handler that
must wait: a SYNC_FLUSH send until its group commit, a held pull until an arrival or its deadline)
is answered from its done callback, still with no task; its result None means the handler wrote
the response itself. Any other *awaitable* (an `async def` handler) runs in one owned task. Both
kinds count towards the connection's in-flight cap and are waited for, then cancelled, by `drain`.

A `ResponseError` becomes a response with its code and remark; any other exception becomes
SYSTEM_ERROR (logged with the request code); an unknown code is answered
REQUEST_CODE_NOT_SUPPORTED. One-way requests get no response."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

from broker.remoting.context import RequestContext
from protocol.channel import Channel
from protocol.codes import FLAG_ONEWAY, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import ConnectionClosed, ResponseError

log = logging.getLogger(__name__)

Reply = RemotingCommand | None
# A request handler: a processor's bound method for one request code; returns the response now, or
# an awaitable of it (any `async def` handler returns a coroutine).
Handler = Callable[[RequestContext, RemotingCommand], Awaitable[Reply] | Reply]


Observer = Callable[[int, int, float], None]   # (request code, response code, seconds)

_WRITE_PAUSE = "responses"      # the pause reason while a connection does not read its responses
_CONTEXT = "request_context"     # the channel attribute holding its `RequestContext`


class Dispatcher:
    """`max_in_flight_per_channel` bounds one connection's memory: past it the broker stops reading
    that connection (TCP back-pressure) until half of its waiting requests have been answered. A
    connection whose responses back up (its transport paused writing) is not read either until
    they drain."""

    def __init__(self, handlers: dict[int, Handler], observe: Observer | None = None,
                 max_in_flight_per_channel: int = 4096) -> None:
        self._handlers = handlers
        self._observe = observe
        self._tasks: set[asyncio.Task[None]] = set()
        self._futures: set[asyncio.Future[Reply]] = set()     # answers that resolve themselves
        self._max_in_flight = max_in_flight_per_channel
        self._per_channel: dict[Channel, int] = {}
        self._paused: set[Channel] = set()

    @property
    def in_flight(self) -> int:
        """Requests waiting in a task or on a future (answered-at-once requests never count)."""
        return len(self._tasks) + len(self._futures)

    def on_request(self, channel: Channel, request: RemotingCommand) -> None:
        started = perf_counter()
        handler = self._handlers.get(request.code)
        response: Reply
        if handler is None:
            response = request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                        remark=f"request code {request.code} is not supported by this broker")
        else:
            ctx = channel.attributes.get(_CONTEXT)
            if ctx is None:
                ctx = channel.attributes[_CONTEXT] = RequestContext(channel, channel.remote_address)
            try:
                answer = handler(ctx, request)
            except Exception as exc:
                response = _error_response(channel, request, exc)
            else:
                if answer is not None and type(answer) is not RemotingCommand:
                    self._spawn(channel, request, answer, started)   # type: ignore[arg-type]
                    return
                response = answer
        self._reply(channel, request, response, started)

    def _reply(self, channel: Channel, request: RemotingCommand, response: Reply, started: float) -> None:
        if self._observe is not None:
            self._observe(request.code, response.code if response is not None else 0, perf_counter() - started)
        if response is None or request.flag & FLAG_ONEWAY or channel.closed:
            return
        try:
            channel.send(response)
        except ConnectionClosed:
            return
        if channel.write_paused and not channel.closed:
            channel.pause_reading(_WRITE_PAUSE)
            self._watch_drain(channel)

    def _watch_drain(self, channel: Channel) -> None:
        async def resume() -> None:
            await channel.drain()
            channel.resume_reading(_WRITE_PAUSE)
        task = asyncio.get_running_loop().create_task(resume())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn(self, channel: Channel, request: RemotingCommand, answer: Awaitable[Reply], started: float) -> None:
        """Answer when `answer` completes: a future (a SYNC_FLUSH send waiting for its group
        commit) from its done callback, with no task; any other awaitable in an owned task."""
        if isinstance(answer, asyncio.Future):
            self._futures.add(answer)
            answer.add_done_callback(functools.partial(self._future_done, channel, request, started))
        else:
            task = asyncio.get_running_loop().create_task(self._finish(channel, request, answer, started))
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

    def _future_done(self, channel: Channel, request: RemotingCommand, started: float,
                     answer: asyncio.Future[Reply]) -> None:
        self._futures.discard(answer)
        try:
            if answer.cancelled():
                return
            exc = answer.exception()
            if exc is None:
                response = answer.result()
            elif isinstance(exc, Exception):
                response = _error_response(channel, request, exc)
            else:
                return
            self._reply(channel, request, response, started)
        finally:
            self._done(channel)

    async def _finish(self, channel: Channel, request: RemotingCommand, answer: Awaitable[Reply],
                      started: float) -> None:
        try:
            try:
                response = await answer
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                response = _error_response(channel, request, exc)
            self._reply(channel, request, response, started)
        finally:
            self._done(channel)

    async def drain(self, timeout_ms: int) -> None:
        """Wait for in-flight requests for at most `timeout_ms`, then cancel the rest."""
        if not self._tasks and not self._futures:
            return
        waiting: set[asyncio.Future[Any]] = {*self._tasks, *self._futures}
        _, pending = await asyncio.wait(waiting, timeout=timeout_ms / 1000)
        if pending:
            log.warning("cancelling %d requests still running after %d ms", len(pending), timeout_ms)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)


def _error_response(channel: Channel, request: RemotingCommand, exc: Exception) -> RemotingCommand:
    if isinstance(exc, ResponseError):
        return request.response(exc.code, remark=exc.remark)
    log.error("request code %d from %s failed", request.code, channel, exc_info=exc)
    return request.response(ResponseCode.SYSTEM_ERROR, remark=f"internal error: {exc.__class__.__name__}: {exc}")
