"""Issue 35, item 1, in process: a connection that does not read its responses holds about
`max_unsent_bytes_per_connection` of them (its pipelined requests wait, unhandled and undecoded),
loses nothing once it reads again, and is closed past `close_unsent_bytes_per_connection` or
`write_stall_timeout_ms`. (tests/chaos/test_unread_pulls.py measures the broker's RSS.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from broker.broker import Broker
from broker.remoting.guard import GuardedConnection
from chaos.unread_pulls import pull_frame
from client.api import ClientAPI
from protocol.codes import ResponseCode
from tests.conftest import broker_config
from tests.helpers import held_pulls, read_commands, send, wait_until

KIB, MIB = 1024, 1024 * 1024
MESSAGE = bytes(200 * KIB)


async def fill(api: ClientAPI, broker: Broker, topic: str, count: int) -> None:
    for _ in range(count):
        await send(api, broker.address, topic, MESSAGE)


async def unread_connection(broker: Broker) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = broker.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    cast(asyncio.Transport, writer.transport).pause_reading()          # reads nothing for now
    return reader, writer


async def the_connection(broker: Broker, writer: asyncio.StreamWriter) -> GuardedConnection:
    """The broker's side of the raw connection `writer` (waits, bounded, until it is accepted)."""
    host, port = writer.get_extra_info("sockname")[:2]
    local = f"{host}:{port}"

    def find() -> GuardedConnection | None:
        return next((c for c in broker.connection_guard.connections.values()
                     if c.channel.remote_address == local), None)
    await wait_until(lambda: find() is not None, what="the connection accepted")
    conn = find()
    assert conn is not None
    return conn


async def test_pipelined_pulls_never_read_hold_about_the_per_connection_bound_and_lose_nothing(
        tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, max_unsent_bytes_per_connection=1 * MIB)) as broker:
        await fill(client_api, broker, "big", 20)
        reader, writer = await unread_connection(broker)
        writer.write(b"".join(pull_frame("big", opaque, opaque % 20) for opaque in range(1, 301)))
        conn = await the_connection(broker, writer)
        await wait_until(lambda: conn.channel.reading_paused and conn.channel.write_paused, what="paused")
        unsent = conn.channel.unsent_bytes
        # 300 answers of 200 KB each asked for: about one bound's worth computed, plus one answer
        assert 1 * MIB < unsent < 1 * MIB + 2 * len(MESSAGE), unsent
        assert conn.protocol.buffered_bytes > 100 * 200        # the rest wait as wire bytes
        assert broker.connection_guard.measure(conn) >= unsent
        assert (await send(client_api, broker.address, "other")).queue_offset == 0   # others are served
        cast(asyncio.Transport, writer.transport).resume_reading()
        async with asyncio.timeout(10):
            answers = await read_commands(reader, 300)
        assert sorted(a.opaque for a in answers) == list(range(1, 301))
        assert {a.code for a in answers} == {ResponseCode.SUCCESS}
        writer.close()


async def test_held_pulls_woken_on_a_connection_that_does_not_read_are_answered_without_messages(
        tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, max_unsent_bytes_per_connection=1 * MIB)) as broker:
        await client_api.create_topic(broker.address, "wake")
        reader, writer = await unread_connection(broker)
        writer.write(b"".join(pull_frame("wake", opaque, 0, suspend_timeout_ms=20_000) for opaque in range(1, 101)))
        await held_pulls(broker, topic="wake", count=100)
        conn = await the_connection(broker, writer)
        await send(client_api, broker.address, "wake", MESSAGE)       # wakes all 100
        hold = broker.hold_service
        assert hold is not None
        await wait_until(lambda: not hold.held.get(("wake", 0)), what="all 100 answered")
        unsent = conn.channel.unsent_bytes
        assert unsent < 1 * MIB + 2 * len(MESSAGE), f"{unsent} bytes unsent: one copy of the message per pull"
        cast(asyncio.Transport, writer.transport).resume_reading()
        async with asyncio.timeout(10):
            answers = await read_commands(reader, 100)
        codes = [a.code for a in answers]
        assert len(answers) == 100 and set(codes) == {ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY}
        for answer in answers:
            if answer.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                assert answer.fields["next_begin_offset"] == 0 and answer.fields["max_offset"] == 1
                assert "max_unsent_bytes_per_connection" in (answer.remark or "")
        writer.close()


async def test_a_connection_past_close_unsent_bytes_per_connection_is_closed(
        tmp_path: Path, client_api: ClientAPI) -> None:
    # (a hard bound below the pause bound: the first write that leaves 1 MiB unsent crosses it)
    async with Broker(broker_config(tmp_path, close_unsent_bytes_per_connection=1 * MIB)) as broker:
        guard = broker.connection_guard
        await fill(client_api, broker, "big", 20)
        _, flooding = await unread_connection(broker)
        flooding.write(b"".join(pull_frame("big", opaque, opaque % 20) for opaque in range(1, 301)))
        await wait_until(lambda: guard.closed["unsent_limit"] == 1, what="closed past the hard bound")
        await wait_until(lambda: len(guard.connections) == 1)            # only the client API's
        assert guard.buffered_bytes == 0
        assert (await send(client_api, broker.address, "other")).queue_offset == 0
        flooding.transport.abort()


async def test_a_connection_whose_unread_responses_make_no_progress_is_closed(
        tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, write_stall_timeout_ms=300)) as broker:
        guard = broker.connection_guard
        await fill(client_api, broker, "big", 20)
        _, stalled = await unread_connection(broker)
        stalled.write(b"".join(pull_frame("big", opaque, opaque % 20) for opaque in range(1, 301)))
        conn = await the_connection(broker, stalled)
        await wait_until(lambda: conn.channel.write_paused, what="its responses backed up")
        await wait_until(lambda: guard.closed["write_stall"] == 1, 5, "closed for making no progress")
        await wait_until(lambda: len(guard.connections) == 1)
        assert guard.buffered_bytes == 0 and guard.closed["unsent_limit"] == 0
        assert (await send(client_api, broker.address, "other")).queue_offset == 0
        stalled.transport.abort()
