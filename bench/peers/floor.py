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

    async with floor_server() as server:
        side = await round_trips(server.address, server, FULL)"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import uvloop

from bench.broker_proc import BrokerProcess
from bench.peers.results import Side
from bench.peers.servers import Measured, ServerMeter, cpu_us_per_call

PING = b"PING\r\n"
PONG = b"+PONG\r\n"


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


async def _serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    server = await loop.create_server(_Pong, host, port)
    bound_host, bound_port = server.sockets[0].getsockname()[:2]
    print(f"listening on {bound_host}:{bound_port}", file=sys.stderr, flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.peers.floor [--listen-port N]`: serve PONGs until SIGTERM. Accepts (and
    ignores) the broker's `--store-dir` and `--set`, so `BrokerProcess` can start it."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument("--store-dir", help="ignored")
    parser.add_argument("--set", action="append", default=[], help="ignored")
    args = parser.parse_args(argv)
    uvloop.run(_serve(args.listen_host, args.listen_port))


@contextlib.asynccontextmanager
async def floor_server() -> AsyncIterator[BrokerProcess]:
    """The do-nothing server in a subprocess of this interpreter, measured as the broker is."""
    async with BrokerProcess(None, command=[sys.executable, "-m", "bench.peers.floor"]) as server:
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


if __name__ == "__main__":
    main()
