"""The floor under the single-request rows: what one round trip costs a server that does no work.

`make bench-peers`' single-send rows give the broker's CPU per send beside Redis's. This measures
the same thing for two servers that do nothing per request, through one identical client (this
process, asyncio streams on uvloop, one request awaited at a time):

- `python -m bench.peers.floor`: a Python process on uvloop, as the broker is, whose protocol
  answers every read with `+PONG\\r\\n` without looking at it (no frame, no parse, no store);
- `redis-server` answering `PING`.

Their CPU per round trip is what the kernel (epoll, read, write, the wake-ups of a process that
sleeps between requests) and the event loop cost before any request is handled; a broker's own
work per request comes on top of it. So the rows show how much of the single-send target (≤ 30 µs
of broker CPU per send) is left for the broker's handling on the machine the run is on.

A third server bounds what a request path written in C could reach: `python -m bench.peers.floor
--answer send` answers SEND_MESSAGE on the wire as the broker does, with nothing per request but
the protocol's frame functions (C when built), a copy of the body into memory and a queue offset
counted per queue: no store, consume queue, index, metrics or hold service. `send_round_trips`
drives it (or the broker) through the client's `ClientAPI.send_message_to`, one send awaited at a
time.

    async with floor_server() as server:
        side = await round_trips(server.address, server, FULL)
    async with floor_server(answer="send") as server:
        side = await send_round_trips(server.address, server, FULL)"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import uvloop

from bench.broker_proc import BrokerProcess
from bench.peers.results import Delivery, Side
from bench.peers.servers import Measured, ServerMeter, cpu_us_per_call
from client.api import ClientAPI
from protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import FrameError
from protocol.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, frame_bytes
from protocol.model import MessageQueue
from protocol.remoting_client import RemotingClient

PING = b"PING\r\n"
PONG = b"+PONG\r\n"
SEND_BODY = bytes(128)
SEND_TOPIC = "peers_floor"
SEND_QUEUES = 8
_RING_BYTES = 64 << 20          # the minimal SEND server's bodies go round this buffer
_SEND_MESSAGE = int(RequestCode.SEND_MESSAGE)
_SUCCESS = int(ResponseCode.SUCCESS)
_SYSTEM_ERROR = int(ResponseCode.SYSTEM_ERROR)


@dataclass(frozen=True, slots=True)
class FloorParams:
    warm_up: int            # round trips before the measured ones
    round_trips: int        # at most this many measured
    time_limit_s: float     # or until this much time has passed


FULL = FloorParams(warm_up=2_000, round_trips=30_000, time_limit_s=3.0)
QUICK = FloorParams(warm_up=500, round_trips=5_000, time_limit_s=1.0)


class _Pong(asyncio.Protocol):
    """Answers every read with PONG: one read per request when the client awaits each answer."""

    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)   # uvloop's: no asyncio base class

    def data_received(self, data: bytes) -> None:
        self.transport.write(PONG)


class _Ring:
    """What the minimal SEND server keeps, shared by its connections: the bodies, going round one
    buffer, and the next queue offset of each (topic, queue_id)."""

    __slots__ = ("buffer", "position", "queue_offsets")

    def __init__(self, size_bytes: int) -> None:
        self.buffer = bytearray(size_bytes)
        self.position = 0
        self.queue_offsets: dict[tuple[str, int], int] = {}


class _Sends(asyncio.Protocol):
    """Answers SEND_MESSAGE as the broker does on the wire (SUCCESS, `msg_id`, `queue_id`,
    `queue_offset`), doing per request only what a request path in C would leave to Python: the
    frame functions of `protocol.frame` (C when built), one copy of the body into the ring, one
    queue offset counted per (topic, queue_id). Any other request is answered SYSTEM_ERROR; a
    malformed frame closes the connection."""

    transport: asyncio.Transport

    def __init__(self, ring: _Ring) -> None:
        self._decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
        self._ring = ring

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            commands = self._decoder.feed(data)
        except FrameError:
            self.transport.close()
            return
        ring = self._ring
        for request in commands:
            fields = request.fields
            topic, queue_id = fields.get("topic"), fields.get("queue_id")
            if request.code != _SEND_MESSAGE or type(topic) is not str or type(queue_id) is not int:
                response = RemotingCommand(_SYSTEM_ERROR, request.opaque, FLAG_RESPONSE,
                                           "this server answers SEND_MESSAGE (with topic and queue_id) only")
            else:
                body = request.body_bytes()
                position = ring.position if ring.position + len(body) <= len(ring.buffer) else 0
                ring.buffer[position:position + len(body)] = body
                ring.position = position + len(body)
                queue_offset = ring.queue_offsets.get((topic, queue_id), 0)
                ring.queue_offsets[(topic, queue_id)] = queue_offset + 1
                response = RemotingCommand(_SUCCESS, request.opaque, FLAG_RESPONSE, None, {
                    "msg_id": f"7F00000100002A9F{position:016X}", "queue_id": queue_id,
                    "queue_offset": queue_offset})
            frame = frame_bytes(response, 0)       # as the broker's `Channel.send` builds it
            assert frame is not None                # no body, so never over the limit
            self.transport.write(frame)


async def _serve(host: str, port: int, answer: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if answer == "send":
        ring = _Ring(_RING_BYTES)
        server = await loop.create_server(lambda: _Sends(ring), host, port)
    else:
        server = await loop.create_server(_Pong, host, port)
    bound_host, bound_port = server.sockets[0].getsockname()[:2]
    print(f"listening on {bound_host}:{bound_port}", file=sys.stderr, flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.peers.floor [--listen-port N] [--answer pong|send]`: serve until SIGTERM.
    Accepts (and ignores) the broker's `--store-dir` and `--set`, so `BrokerProcess` can start it."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument("--answer", choices=("pong", "send"), default="pong",
                        help="pong: +PONG to every read, unparsed; send: SEND_MESSAGE answered with the frame "
                             "functions and a copy of the body, no store")
    parser.add_argument("--store-dir", help="ignored")
    parser.add_argument("--set", action="append", default=[], help="ignored")
    args = parser.parse_args(argv)
    uvloop.run(_serve(args.listen_host, args.listen_port, args.answer))


@contextlib.asynccontextmanager
async def floor_server(answer: str = "pong") -> AsyncIterator[BrokerProcess]:
    """The do-nothing server (`answer="pong"`) or the minimal SEND server (`"send"`) in a
    subprocess of this interpreter, measured as the broker is."""
    command = [sys.executable, "-m", "bench.peers.floor", "--answer", answer]
    async with BrokerProcess(None, command=command) as server:
        yield server


async def round_trips(address: str, server: Measured, params: FloorParams) -> Side:
    """PING/PONG round trips awaited one at a time on one connection: the rate (value, per second)
    and the server's and this client's CPU µs per round trip (details, as the send rows give them)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        async def one() -> None:
            writer.write(PING)
            answer = await reader.readuntil(b"\n")
            if answer != PONG:
                raise RuntimeError(f"expected PONG, got {answer!r}")

        for _ in range(params.warm_up):
            await one()
        meter = ServerMeter(server).start()
        started = time.perf_counter()
        deadline = started + params.time_limit_s
        done = 0
        while done < params.round_trips and time.perf_counter() < deadline:
            await one()
            done += 1
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if done == 0:
        raise RuntimeError(f"no round trip finished within {params.time_limit_s} s")
    rate = done / elapsed
    details: dict[str, float] = {"round_trips": done, "elapsed_s": round(elapsed, 2), **cpu,
                                 **cpu_us_per_call(cpu, rate)}
    return Side(value=round(rate), details=details)


async def send_round_trips(address: str, server: Measured, params: FloorParams) -> Side:
    """SEND_MESSAGE of 128 B awaited one at a time through `ClientAPI.send_message_to` (what
    `Producer.send` calls once it has chosen a queue), round robin over `SEND_QUEUES` queues of
    `SEND_TOPIC` (a broker must have the topic): the rate and the server's and this client's CPU
    µs per send, as `round_trips`. Delivery: every acknowledged (queue_id, queue_offset) once,
    each queue's offsets consecutive from the first acknowledged one."""
    api = ClientAPI(RemotingClient())
    queues = [MessageQueue(SEND_TOPIC, "floor", queue_id) for queue_id in range(SEND_QUEUES)]
    properties: dict[str, str] = {}
    acked: list[int] = []
    try:
        for index in range(params.warm_up):
            await api.send_message_to(address, queues[index % SEND_QUEUES], "peers_floor", SEND_BODY, properties)
        meter = ServerMeter(server).start()
        started = time.perf_counter()
        deadline = started + params.time_limit_s
        done = 0
        while done < params.round_trips and time.perf_counter() < deadline:
            result = await api.send_message_to(address, queues[done % SEND_QUEUES], "peers_floor", SEND_BODY,
                                               properties)
            acked.append(result.queue_id << 32 | result.queue_offset)
            done += 1
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        await api.remoting.close()
    if done == 0:
        raise RuntimeError(f"no send finished within {params.time_limit_s} s")
    first: dict[int, int] = {}          # queue_id -> its first acknowledged key
    counts: Counter[int] = Counter()
    for key in acked:
        first[key >> 32] = min(first.get(key >> 32, key), key)
        counts[key >> 32] += 1
    expected = [start + i for queue_id, start in first.items() for i in range(counts[queue_id])]
    rate = done / elapsed
    details: dict[str, float] = {"sends": done, "elapsed_s": round(elapsed, 2), **cpu, **cpu_us_per_call(cpu, rate)}
    return Side(value=round(rate), delivery=Delivery.of(expected, acked), details=details)


if __name__ == "__main__":
    main()
