"""`broker.remoting.dispatcher.answer_of`: a handler's return value of any kind awaited in process
(the gRPC API runs the broker's handlers this way)."""

from __future__ import annotations

import asyncio

import pytest

from broker.remoting.dispatcher import Deferred, answer_of
from protocol.command import RemotingCommand, request
from protocol.errors import TopicNotExist


def response() -> RemotingCommand:
    return request(10).response()


async def test_a_plain_reply_and_none_come_back_as_they_are() -> None:
    reply = response()
    assert await answer_of(reply) is reply
    assert await answer_of(None) is None


async def test_an_awaitable_is_awaited() -> None:
    reply = response()

    async def handler() -> RemotingCommand:
        await asyncio.sleep(0)
        return reply
    assert await answer_of(handler()) is reply


async def test_a_deferred_resolved_later_or_already() -> None:
    reply = response()
    later = Deferred()
    asyncio.get_running_loop().call_soon(later.set_result, reply)
    assert await asyncio.wait_for(answer_of(later), 5) is reply
    done = Deferred()
    done.set_result(reply)
    assert await answer_of(done) is reply


async def test_a_deferred_failure_is_raised() -> None:
    failed = Deferred()
    asyncio.get_running_loop().call_soon(failed.set_exception, TopicNotExist("t"))
    with pytest.raises(TopicNotExist):
        await asyncio.wait_for(answer_of(failed), 5)
    already = Deferred()
    already.set_exception(TopicNotExist("t"))
    with pytest.raises(TopicNotExist):
        await answer_of(already)


async def test_cancelling_the_wait_gives_the_deferred_up() -> None:
    pending = Deferred()
    waiting = asyncio.ensure_future(answer_of(pending))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pending.done()
    pending.set_result(response())          # a late resolution is ignored
