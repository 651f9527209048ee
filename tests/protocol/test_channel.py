"""Channel over loopback TCP: correlation, timeouts, closes and protocol errors."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import msgpack
import pytest

from bench.inproc_harness import DroppingTransport
from protocol.channel import Channel
from protocol.channel_protocol import ChannelProtocol, connect
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import ConnectionClosed, RequestTimeout
from protocol.frame import FrameDecoder, encode_frame_bytes
from tests.helpers import read_commands

WAIT_S = 5   # bound on every wait; the happy paths take milliseconds
RequestHandler = Callable[[Channel, RemotingCommand], None]


class Server:
    """ChannelProtocol server on 127.0.0.1:0 that records its channels."""

    def __init__(self, on_request: RequestHandler | None, max_frame_bytes: int, max_dispatch_per_step: int = 0) -> None:
        self.on_request, self.max_frame_bytes = on_request, max_frame_bytes
        self.max_dispatch_per_step = max_dispatch_per_step
        self.channels: list[Channel] = []
        self.closed: list[Channel] = []
        self.lost = asyncio.Event()
        self.port = 0

    def _lost(self, channel: Channel) -> None:
        self.closed.append(channel)
        self.lost.set()

    def protocol(self) -> ChannelProtocol:
        return ChannelProtocol(on_request=self.on_request, on_connect=self.channels.append,
                               on_close=self._lost, max_frame_bytes=self.max_frame_bytes,
                               max_dispatch_per_step=self.max_dispatch_per_step)


@contextlib.asynccontextmanager
async def serving(on_request: RequestHandler | None = None, max_frame_bytes: int = 1 << 20,
                  max_dispatch_per_step: int = 0) -> AsyncIterator[Server]:
    server = Server(on_request, max_frame_bytes, max_dispatch_per_step)
    tcp = await asyncio.get_running_loop().create_server(server.protocol, "127.0.0.1", 0)
    server.port = tcp.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        tcp.close()
        for channel in server.channels:
            channel.close()
            await channel.wait_closed()
        await tcp.wait_closed()


@contextlib.asynccontextmanager
async def client(server: Server, on_request: RequestHandler | None = None) -> AsyncIterator[Channel]:
    channel = await connect("127.0.0.1", server.port, on_request=on_request, timeout_ms=WAIT_S * 1000)
    try:
        yield channel
    finally:
        channel.close()
        await channel.wait_closed()


def frame_bytes(header: Any, body: bytes = b"") -> bytes:
    packed: bytes = msgpack.packb(header, use_bin_type=True)
    return struct.pack(">II", 4 + len(packed) + len(body), len(packed)) + packed + body


async def test_invokes_are_correlated_when_answered_out_of_order() -> None:
    count, received = 64, []

    def answer_in_reverse(channel: Channel, cmd: RemotingCommand) -> None:
        received.append(cmd)
        if len(received) == count:
            for req in reversed(received):
                channel.send(req.response(header={"i": req.fields["i"]}, body=b"r%d" % req.fields["i"]))

    async with asyncio.timeout(WAIT_S), serving(answer_in_reverse) as server, client(server) as channel:
        responses = await asyncio.gather(
            *(channel.invoke(request(RequestCode.SEND_MESSAGE, {"i": i}), timeout_ms=WAIT_S * 1000)
              for i in range(count)))
        assert [r.fields["i"] for r in responses] == list(range(count))
        assert [r.body for r in responses] == [b"r%d" % i for i in range(count)]
        assert all(r.is_response and r.code == ResponseCode.SUCCESS for r in responses)
        assert len({cmd.opaque for cmd in received}) == count
        assert channel.pending == {}


async def test_request_timeout_when_the_server_never_answers() -> None:
    held: list[tuple[Channel, RemotingCommand]] = []

    def hold_pulls(channel: Channel, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.PULL_MESSAGE:
            held.append((channel, cmd))
        else:
            channel.send(cmd.response(header={"late": False}))

    async with asyncio.timeout(WAIT_S), serving(hold_pulls) as server, client(server) as channel:
        with pytest.raises(RequestTimeout) as info:
            await channel.invoke(request(RequestCode.PULL_MESSAGE), timeout_ms=50)
        assert (info.value.request_code, info.value.timeout_ms) == (RequestCode.PULL_MESSAGE, 50)
        assert channel.pending == {}
        (server_channel, pull), = held
        server_channel.send(pull.response(header={"late": True}))   # arrives after the timeout: ignored
        response = await channel.invoke(request(RequestCode.GET_MAX_OFFSET), timeout_ms=WAIT_S * 1000)
        assert response.fields == {"late": False}


async def test_a_shorter_timeout_expires_first_while_a_longer_one_waits() -> None:
    """Deadlines are swept per channel: a request with a shorter timeout than one already waiting
    still fails at its own deadline, and the longer one is answered normally afterwards."""
    held: list[tuple[Channel, RemotingCommand]] = []
    first_held = asyncio.Event()

    def hold(channel: Channel, cmd: RemotingCommand) -> None:
        held.append((channel, cmd))
        first_held.set()

    async with asyncio.timeout(WAIT_S), serving(hold) as server, client(server) as channel:
        long_wait = asyncio.create_task(channel.invoke(request(RequestCode.PULL_MESSAGE), timeout_ms=60_000))
        await first_held.wait()
        with pytest.raises(RequestTimeout) as info:
            await channel.invoke(request(RequestCode.GET_MAX_OFFSET), timeout_ms=50)
        assert (info.value.request_code, info.value.timeout_ms) == (RequestCode.GET_MAX_OFFSET, 50)
        assert not long_wait.done()
        server_channel, pull = held[0]
        server_channel.send(pull.response(header={"answered": True}))
        assert (await long_wait).fields == {"answered": True}
        assert channel.pending == {}


async def test_pending_invokes_fail_when_the_server_closes() -> None:
    count, received = 3, []

    def close_after_all(channel: Channel, cmd: RemotingCommand) -> None:
        received.append(cmd)
        if len(received) == count:
            channel.close()

    async with asyncio.timeout(WAIT_S), serving(close_after_all) as server, client(server) as channel:
        invokes = [channel.invoke(request(RequestCode.HEART_BEAT), timeout_ms=WAIT_S * 1000)
                   for _ in range(count)]
        results = await asyncio.gather(*invokes, return_exceptions=True)
        assert all(isinstance(r, ConnectionClosed) for r in results), results
        await channel.wait_closed()
        assert channel.closed and channel.pending == {}
        with pytest.raises(ConnectionClosed):
            channel.send(request(RequestCode.HEART_BEAT))
        with pytest.raises(ConnectionClosed):
            await channel.invoke(request(RequestCode.HEART_BEAT), timeout_ms=WAIT_S * 1000)


async def test_requests_flow_both_ways_and_oneway_gets_no_response() -> None:
    seen_by_server: list[RemotingCommand] = []
    seen_by_client: list[RemotingCommand] = []
    oneway_arrived = asyncio.Event()

    def server_handler(channel: Channel, cmd: RemotingCommand) -> None:
        seen_by_server.append(cmd)
        if cmd.is_oneway:
            oneway_arrived.set()

    def client_handler(channel: Channel, cmd: RemotingCommand) -> None:
        seen_by_client.append(cmd)
        if not cmd.is_oneway:
            channel.send(cmd.response(header={"client": "c1"}))

    async with asyncio.timeout(WAIT_S), serving(server_handler) as server, \
            client(server, on_request=client_handler) as channel:
        channel.invoke_oneway(request(RequestCode.UNREGISTER_CLIENT, {"client_id": "c1"}))
        await oneway_arrived.wait()
        assert seen_by_server[0].is_oneway and seen_by_server[0].fields == {"client_id": "c1"}
        (server_channel,) = server.channels
        notify = request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumer_group": "g"})
        server_channel.invoke_oneway(notify)
        stats = request(RequestCode.GET_CONSUME_STATS)
        response = await server_channel.invoke(stats, timeout_ms=WAIT_S * 1000)
        assert response.fields == {"client": "c1"}
        assert [c.code for c in seen_by_client] == [RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                    RequestCode.GET_CONSUME_STATS]
        assert server_channel.remote_address == channel.local_address


async def read_until_eof(reader: asyncio.StreamReader) -> list[RemotingCommand]:
    """Every command the peer sends until it closes the connection."""
    decoder, commands = FrameDecoder(), []
    while chunk := await reader.read(65_536):
        commands += decoder.feed(chunk)
    assert decoder.buffered_bytes == 0
    return commands


async def raw_exchange(server: Server, data: bytes) -> list[RemotingCommand]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(data)
        await writer.drain()
        return await read_until_eof(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.parametrize(("header", "complaint"), [
    ({"code": "10", "opaque": 7}, "code"),
    ({"code": 10, "opaque": 7, "ext": [1, 2]}, "ext"),
    ({"opaque": 7, "flag": 0}, "code"),
])
async def test_garbage_with_readable_opaque_gets_system_error_then_close(header: Any, complaint: str) -> None:
    requests: list[RemotingCommand] = []
    async with asyncio.timeout(WAIT_S), serving(lambda ch, cmd: requests.append(cmd)) as server:
        (answer,) = await raw_exchange(server, frame_bytes(header))
        assert (answer.code, answer.opaque, answer.is_response) == (ResponseCode.SYSTEM_ERROR, 7, True)
        assert answer.remark is not None and complaint in answer.remark
        await server.lost.wait()
        assert requests == [] and server.closed == server.channels


@pytest.mark.parametrize("data", [
    struct.pack(">II", 2, 0) + b"\0\0",                          # frame_length < 4
    struct.pack(">II", 1 << 20, 4),                               # over the server's max_frame_bytes
    frame_bytes([10, 7]),                                         # header is an array
    frame_bytes({"code": 10, "opaque": "7"}),                     # opaque unreadable
    struct.pack(">II", 8, 6) + b"\xc1\xc1\xc1\xc1\xc1\xc1",       # header is not msgpack
])
async def test_garbage_without_readable_opaque_closes_silently(data: bytes) -> None:
    async with asyncio.timeout(WAIT_S), serving(max_frame_bytes=1024) as server:
        assert await raw_exchange(server, data) == []
        await server.lost.wait()
        assert len(server.closed) == 1


async def test_valid_request_from_raw_socket_is_delivered() -> None:
    def echo(channel: Channel, cmd: RemotingCommand) -> None:
        channel.send(cmd.response(header=cmd.fields, body=cmd.body_bytes()))
        channel.close()

    async with asyncio.timeout(WAIT_S), serving(echo) as server:
        sent = RemotingCommand(code=RequestCode.SEND_MESSAGE, opaque=99, fields={"topic": "t"}, body=b"x")
        (answer,) = await raw_exchange(server, encode_frame_bytes(sent))
        assert (answer.opaque, answer.fields, answer.body, answer.version) == (99, {"topic": "t"}, b"x", 1)


async def test_connect_to_a_closed_port_raises_connection_closed() -> None:
    async with serving() as server:
        port = server.port
    with pytest.raises(ConnectionClosed, match="cannot connect"):
        await connect("127.0.0.1", port, timeout_ms=WAIT_S * 1000)


class LoopSteps:
    """Counts event-loop steps: a callback that re-schedules itself once per step while running."""

    def __init__(self) -> None:
        self.count = 0
        self._running = False

    def start(self) -> None:
        self._running = True
        self._tick()

    def stop(self) -> None:
        self._running = False

    def _tick(self) -> None:
        self.count += 1
        if self._running:
            asyncio.get_running_loop().call_soon(self._tick)


def numbered_requests(count: int) -> bytes:
    """`count` GET_MAX_OFFSET requests numbered by opaque and field "i", as one write."""
    frames = []
    for i in range(count):
        cmd = request(RequestCode.GET_MAX_OFFSET, {"i": i})
        cmd.opaque = i
        frames.append(encode_frame_bytes(cmd))
    return b"".join(frames)


async def test_a_burst_is_handled_a_chunk_per_loop_step_in_order_and_unread_meanwhile() -> None:
    """`max_dispatch_per_step=4`: 20 pipelined requests (one write, so one read) are handled four
    per loop step, in the order sent; the connection is not read while some wait, and is read
    again once the last chunk is taken."""
    steps = LoopSteps()
    handled: list[tuple[int, int, bool]] = []      # (i, loop step, reading paused)

    def answer(channel: Channel, cmd: RemotingCommand) -> None:
        handled.append((cmd.fields["i"], steps.count, channel.reading_paused))
        channel.send(cmd.response(header={"i": cmd.fields["i"]}))

    async with asyncio.timeout(WAIT_S), serving(answer, max_dispatch_per_step=4) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        steps.start()
        try:
            writer.write(numbered_requests(20))
            answers = await read_commands(reader, 20)
            assert [a.opaque for a in answers] == list(range(20))
            assert [i for i, _, _ in handled] == list(range(20))
            per_step = [step for _, step, _ in handled]
            assert [per_step.count(step) for step in sorted(set(per_step))] == [4] * 5
            assert [paused for _, _, paused in handled] == [True] * 16 + [False] * 4
            writer.write(numbered_requests(1))          # read again
            (again,) = await read_commands(reader, 1)
            assert again.opaque == 0 and len(handled) == 21
        finally:
            steps.stop()
            writer.close()


async def test_without_a_bound_a_read_is_handled_in_one_step() -> None:
    steps = LoopSteps()
    handled: list[int] = []

    def answer(channel: Channel, cmd: RemotingCommand) -> None:
        handled.append(steps.count)
        channel.send(cmd.response())

    async with asyncio.timeout(WAIT_S), serving(answer) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        steps.start()
        try:
            writer.write(numbered_requests(20))
            assert [a.opaque for a in await read_commands(reader, 20)] == list(range(20))
            assert len(set(handled)) == 1
        finally:
            steps.stop()
            writer.close()


async def test_requests_waiting_their_turn_are_handled_before_the_close_is_reported() -> None:
    """The first request closes the connection while 16 wait their turn: they are still handled
    (as every received request is), all before `on_close`, and nothing is answered on it."""
    handled: list[int] = []
    handled_at_close: list[int] = []

    def close_at_first(channel: Channel, cmd: RemotingCommand) -> None:
        handled.append(cmd.fields["i"])
        if cmd.fields["i"] == 0:
            channel.close()
        elif not channel.closed:
            channel.send(cmd.response())

    async with asyncio.timeout(WAIT_S), serving(close_at_first, max_dispatch_per_step=4) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(numbered_requests(20))
            await server.lost.wait()
            handled_at_close.extend(handled)
            answers = await read_until_eof(reader)
        finally:
            writer.close()
    assert handled_at_close == list(range(20))
    assert {a.opaque for a in answers} <= {1, 2, 3}     # at most the rest of the first chunk


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_dispatch_per_step"):
        Channel(cast(asyncio.Transport, None), max_dispatch_per_step=-1)


async def test_a_failing_handler_at_the_loss_still_lets_the_close_be_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    """The connection is lost with 16 requests waiting their turn and the handler fails on one:
    that is logged, and the close is still reported (the broker unregisters the connection)."""
    handled: list[int] = []
    closed: list[Channel] = []

    def fail_at_ten(channel: Channel, cmd: RemotingCommand) -> None:
        handled.append(cmd.fields["i"])
        if cmd.fields["i"] == 10:
            raise RuntimeError("handler failed")

    protocol = ChannelProtocol(on_request=fail_at_ten, on_close=closed.append, max_dispatch_per_step=4)
    protocol.connection_made(DroppingTransport(40_001))
    protocol.data_received(numbered_requests(20))
    assert handled == [0, 1, 2, 3]
    protocol.connection_lost(None)
    assert handled == list(range(11)) and closed == [protocol.channel]
    assert "handling 16 commands received before the connection was lost failed" in caplog.text


@pytest.mark.parametrize("at_once", [None, 1024])
async def test_a_frame_of_write_at_once_bytes_leaves_at_once_with_those_queued_before_it(at_once: int | None) -> None:
    """Frames sent in one loop step after the first are queued to its end, unless one is at least
    `write_at_once_bytes` long: it leaves at once with those queued before it (in order); a small
    one after it is queued again. The peer gets all of them, in order, either way."""
    received: list[RemotingCommand] = []
    got_all = asyncio.Event()

    def on_request(channel: Channel, cmd: RemotingCommand) -> None:
        received.append(cmd)
        if len(received) == 4:
            got_all.set()

    async with serving(on_request) as server, client(server) as channel:
        channel.write_at_once_bytes = at_once
        small, large = b"s" * 16, b"L" * 4096

        def numbered(i: int, body: bytes) -> RemotingCommand:
            cmd = request(RequestCode.HEART_BEAT, None, body)
            cmd.opaque = i
            return cmd

        for i in range(2):      # one step: the first written, the second queued
            channel.send(numbered(i, small))
        queued_before = channel.unsent_bytes
        channel.send(numbered(2, large))
        after_large = channel.unsent_bytes
        channel.send(numbered(3, small))
        assert queued_before > 0
        if at_once is None:
            assert after_large > len(large), "queued with the others"
        else:
            assert after_large == channel.transport.get_write_buffer_size() < len(large), "written at once"
            assert channel.unsent_bytes > after_large, "a small frame after it is queued again"
        async with asyncio.timeout(WAIT_S):
            await got_all.wait()
        assert [cmd.opaque for cmd in received] == [0, 1, 2, 3]
        assert [cmd.body_bytes() for cmd in received] == [small, small, large, small]
