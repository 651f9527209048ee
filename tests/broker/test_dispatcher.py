"""The dispatcher's `Deferred` answers over real loopback channels: written inside their resolution,
errors answered with their code, given up at a drain, resolved early, cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.remoting.context import RequestContext
from broker.remoting.dispatcher import Deferred, Dispatcher, settle_written
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import TopicNotExist
from tests.protocol.test_channel import client, serving

WAIT_S = 5
CODE = 42


class Held:
    """A handler that answers every request with a Deferred it keeps for the test to resolve."""

    def __init__(self) -> None:
        self.pending: list[tuple[Deferred, RemotingCommand]] = []
        self.arrived = asyncio.Event()
        self.early = False          # return the Deferred already resolved

    def __call__(self, ctx: RequestContext, cmd: RemotingCommand) -> Deferred:
        answer = Deferred()
        if self.early:
            answer.set_result(cmd.response(ResponseCode.SUCCESS, {"early": True}))
            return answer
        self.pending.append((answer, cmd))
        self.arrived.set()
        return answer

    async def next(self) -> tuple[Deferred, RemotingCommand]:
        await asyncio.wait_for(self.arrived.wait(), WAIT_S)
        self.arrived.clear()
        return self.pending[-1]


@pytest.fixture
async def held() -> AsyncIterator[tuple[Dispatcher, Held]]:
    handler = Held()
    dispatcher = Dispatcher({CODE: handler})
    yield dispatcher, handler


async def test_a_deferred_is_answered_inside_its_resolution(held: tuple[Dispatcher, Held]) -> None:
    dispatcher, handler = held
    async with serving(dispatcher.on_request) as server, client(server) as channel:
        call = asyncio.create_task(channel.invoke(request(CODE), 5_000))
        answer, cmd = await handler.next()
        assert dispatcher.in_flight == 1 and not answer.done()
        answer.set_result(cmd.response(ResponseCode.SUCCESS, {"x": 1}))
        assert dispatcher.in_flight == 0 and answer.done()      # answered inside the call, no later step
        response = await asyncio.wait_for(call, WAIT_S)
        assert (response.code, response.fields) == (ResponseCode.SUCCESS, {"x": 1})
        answer.set_result(cmd.response(ResponseCode.SYSTEM_ERROR))      # a second resolution: ignored


async def test_a_deferred_error_is_answered_with_its_code(held: tuple[Dispatcher, Held]) -> None:
    dispatcher, handler = held
    async with serving(dispatcher.on_request) as server, client(server) as channel:
        call = asyncio.create_task(channel.invoke(request(CODE), 5_000))
        answer, _ = await handler.next()
        answer.set_exception(TopicNotExist("t"))
        response = await asyncio.wait_for(call, WAIT_S)
        assert response.code == ResponseCode.TOPIC_NOT_EXIST and "'t'" in (response.remark or "")


async def test_a_deferred_resolved_before_it_is_returned_is_answered_at_once(held: tuple[Dispatcher, Held]) -> None:
    dispatcher, handler = held
    async with serving(dispatcher.on_request) as server, client(server) as channel:
        handler.early = True
        response = await asyncio.wait_for(channel.invoke(request(CODE), 5_000), WAIT_S)
        assert response.fields == {"early": True} and dispatcher.in_flight == 0


async def test_drain_gives_up_on_unresolved_deferreds(held: tuple[Dispatcher, Held]) -> None:
    dispatcher, handler = held
    async with serving(dispatcher.on_request) as server, client(server) as channel:
        calls = [asyncio.create_task(channel.invoke(request(CODE), 300)) for _ in range(2)]
        first, _ = await handler.next()
        while len(handler.pending) < 2:
            await handler.next()
        first.set_result(None)                      # None: the handler wrote (here: nothing) itself
        await asyncio.wait_for(dispatcher.drain(50), WAIT_S)
        (late, cmd) = handler.pending[1]
        assert late.done() and dispatcher.in_flight == 0
        late.set_result(cmd.response(ResponseCode.SUCCESS))          # after giving up: nothing is written
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, Exception) for r in results), results   # neither got a response


async def test_drain_returns_once_the_last_deferred_is_resolved(held: tuple[Dispatcher, Held]) -> None:
    dispatcher, handler = held
    async with serving(dispatcher.on_request) as server, client(server) as channel:
        call = asyncio.create_task(channel.invoke(request(CODE), 5_000))
        answer, cmd = await handler.next()
        drain = asyncio.create_task(dispatcher.drain(60_000))
        await asyncio.sleep(0)
        assert not drain.done()
        answer.set_result(cmd.response(ResponseCode.SUCCESS))
        await asyncio.wait_for(drain, WAIT_S)
        assert (await asyncio.wait_for(call, WAIT_S)).code == ResponseCode.SUCCESS


async def test_settle_written_resolves_answers_whose_responses_were_written() -> None:
    observed: list[tuple[int, int]] = []
    handler = Held()
    dispatcher = Dispatcher({CODE: handler},
                            observe=lambda code, response_code, _: observed.append((code, response_code)))
    async with serving(dispatcher.on_request) as server, client(server) as channel:
        calls = [asyncio.create_task(channel.invoke(request(CODE), 5_000)) for _ in range(3)]
        while len(handler.pending) < 3:
            await handler.next()
        (first, first_cmd), (given_up, _), (last, last_cmd) = handler.pending
        given_up.cancel()                           # skipped, as `set_result` would skip it
        drain = asyncio.create_task(dispatcher.drain(60_000))
        await asyncio.sleep(0)
        for answer, cmd in ((first, first_cmd), (last, last_cmd)):     # the handler writes them itself
            answer.channel.send(cmd.response(ResponseCode.SUCCESS, {"opaque": cmd.opaque}))
        settle_written([first, given_up, last])
        assert first.done() and last.done() and dispatcher.in_flight == 0
        assert observed == [(CODE, 0), (CODE, 0)]
        await asyncio.wait_for(drain, WAIT_S)       # the last one settled: drain returns
        done, pending = await asyncio.wait(calls, timeout=0.3)
        assert {calls.index(c) for c in done} == {0, 2} and len(pending) == 1
        for call in pending:
            call.cancel()


async def test_a_connection_with_too_many_body_bytes_waiting_is_paused_until_a_quarter_are_answered() -> None:
    """Requests waiting for an answer (a send waiting for its fsync) keep their bodies: past
    `max_in_flight_bytes_per_channel` of them the connection is not read until they are answered."""
    handler = Held()
    dispatcher = Dispatcher({CODE: handler}, max_in_flight_bytes_per_channel=1_000)
    async with serving(dispatcher.on_request) as server, client(server) as channel:
        calls = [asyncio.create_task(channel.invoke(request(CODE, body=bytes(600)), 5_000)) for _ in range(3)]
        await handler.next()
        while len(handler.pending) < 2:
            await handler.next()
        assert dispatcher.in_flight_bytes(server.channels[0]) == 1_200
        done, _ = await asyncio.wait({calls[2]}, timeout=0.3)
        assert not done and len(handler.pending) == 2, "the third was handled past the byte bound"
        for answer, cmd in list(handler.pending):
            answer.set_result(cmd.response())
        answer, cmd = await handler.next()                     # read again: the third arrives
        answer.set_result(cmd.response())
        assert [r.code for r in await asyncio.gather(*calls)] == [ResponseCode.SUCCESS] * 3
        assert dispatcher.in_flight_bytes(server.channels[0]) == 0
