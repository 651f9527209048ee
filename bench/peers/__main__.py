"""`python -m bench.peers [--quick] [--only WORKLOAD]... [--pairing NAME]... [--system NAME]`: rocketq
against Redis Streams on the same workloads, through each system's Python client, in one run.

Prints one row per measurement with both systems, the ratio rocketq/Redis and its target, and the
delivery check of both sides; writes `bench/results/peers.json` (`peers-quick.json` with --quick).
Exit code 0 when every run completed and delivered every message (a missed target is only marked
MISS), 1 otherwise."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from importlib.metadata import version
from typing import Any, TypeVar

from bench.common import Options, run, running_broker, wait_for_quiet
from bench.peers import blocked, consume, floor, send, wake
from bench.peers.results import RatioOp, Row, Side, format_table, write_json
from bench.peers.servers import DURABLE, IN_MEMORY, Pairing, RedisServer, raise_fd_limit, redis_version
from bench.report import cpu_idle_line

T = TypeVar("T")
WORKLOADS = ("send_one", "send_batch", "send_seq", "batch_seq", "consume", "consume_seq", "e2e", "wake", "blocked")
PAIRINGS = {p.name: p for p in (IN_MEMORY, DURABLE)}
SYSTEMS = ("rocketq", "redis")
THROUGHPUT_TARGET: tuple[RatioOp, float] = ("≥", 1.5)
SEQUENTIAL_SEND_TARGET: tuple[RatioOp, float] = ("≥", 1.0)
BROKER_US_PER_SEND: tuple[RatioOp, float] = ("≤abs", 30.0)    # µs of broker CPU per single send (in-memory)
CLIENT_US_PER_SEND: tuple[RatioOp, float] = ("≤abs", 40.0)
log = logging.getLogger("bench.peers")


class Session:
    """One run: options, the rows so far, notes, and which systems run in what order."""

    def __init__(self, opts: Options, systems: tuple[str, ...]) -> None:
        self.opts = opts
        self.systems = systems
        self.rows: list[Row] = []
        self.notes: list[str] = []
        self.alternation = 0

    async def quiet(self, label: str) -> None:
        busy = await asyncio.to_thread(wait_for_quiet, 3.0 if self.opts.quick else 10.0)
        if busy >= 0.3:
            self.notes.append(f"{label}: the machine was busy ({busy:.2f} cores used by others) at the start")

    async def attempt(self, system: str, label: str, call: Callable[[], Awaitable[T]],
                      failed: Callable[[Side], T]) -> T:
        """Run one system's side (unless skipped): any exception becomes an error Side."""
        if system not in self.systems:
            return failed(Side(details={"skipped": True}))
        await self.quiet(f"{label} {system}")
        print(f"[peers] {label}: {system} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            return await call()
        except Exception as exc:
            log.error("%s %s failed: %s", label, system, traceback.format_exc())
            return failed(Side(error=f"{type(exc).__name__}: {exc}"))
        finally:
            elapsed = time.perf_counter() - started
            print(f"[peers] {label}: {system} done in {elapsed:.1f} s", file=sys.stderr, flush=True)

    async def pair(self, label: str, rocketq: Callable[[], Awaitable[T]], redis: Callable[[], Awaitable[T]],
                   failed: Callable[[Side], T]) -> tuple[T, T]:
        """Both systems, alternating which one goes first from one workload to the next."""
        self.alternation += 1
        if self.alternation % 2:
            a = await self.attempt("rocketq", label, rocketq, failed)
            b = await self.attempt("redis", label, redis, failed)
            return a, b
        b = await self.attempt("redis", label, redis, failed)
        a = await self.attempt("rocketq", label, rocketq, failed)
        return a, b


def _same(side: Side) -> Side:
    return side


async def run_pairing(session: Session, pairing: Pairing, only: set[str]) -> None:
    quick = session.opts.quick
    async with RedisServer(durable=pairing.redis_durable) as redis_server, \
            running_broker(session.opts, pairing.broker_settings) as broker:
        p = pairing.name
        rows = session.rows
        if "send_one" in only:
            await _send_row(session, broker, redis_server, p, send.ONE_QUICK if quick else send.ONE_FULL,
                            "peers_one", "send one-at-a-time 128B", THROUGHPUT_TARGET)
        if "send_seq" in only:
            a, b = await _send_row(session, broker, redis_server, p,
                                   send.ONE_SEQ_QUICK if quick else send.ONE_SEQ_FULL, "peers_seq",
                                   "send 1 awaited at a time 128B", SEQUENTIAL_SEND_TARGET,
                                   note="one producer awaiting each send")
            _cpu_rows(rows, "send 1 awaited at a time", p, a, b)
            if pairing is IN_MEMORY:
                await _floor_rows(session, redis_server, p, b)
        if "send_batch" in only:
            for size in (128, 1024):
                name = "128B" if size == 128 else "1KiB"
                await _send_row(session, broker, redis_server, p, send.BATCH_QUICK if quick else send.BATCH_FULL,
                                f"peers_batch_{size}", f"send batch of 32 {name}", THROUGHPUT_TARGET,
                                batched=True, body_bytes=size)
        if "batch_seq" in only:
            await _send_row(session, broker, redis_server, p,
                            send.BATCH_SEQ_QUICK if quick else send.BATCH_SEQ_FULL, "peers_batch_seq",
                            "batch of 32 awaited at a time 128B", THROUGHPUT_TARGET, batched=True,
                            note="one producer awaiting each batch")
        if "consume" in only:
            await _consume(session, broker, redis_server, p)
        if "consume_seq" in only:
            cseq = consume.SEQ_QUICK if quick else consume.SEQ_FULL
            a, b = await session.pair(
                f"consume_seq [{p}]", lambda: consume.rocketq_fetch_loop(broker, cseq),
                lambda: consume.redis_fetch_loop(redis_server, cseq), _same)
            rows.append(Row(workload="1 consumer, fetch 32 + commit per fetch", pairing=p, unit="msg/s", rocketq=a,
                            redis=b, target=THROUGHPUT_TARGET,
                            note=f"{cseq.backlog} messages; rocketq commit carried by the next pull, "
                                 f"Redis one XACK per read"))
        if "e2e" in only:
            cparams = consume.QUICK if quick else consume.FULL
            a, b = await session.pair(f"e2e x{cparams.consumers} [{p}]", lambda: consume.rocketq_e2e(broker, cparams),
                                      lambda: consume.redis_e2e(redis_server, cparams), _same)
            rows.append(Row(workload=f"{cparams.consumers} consumers end to end", pairing=p, unit="msg/s",
                            rocketq=a, redis=b, target=THROUGHPUT_TARGET,
                            note=f"{cparams.e2e} messages, {cparams.producers} producer tasks of batches of 32"))
        if "wake" in only:
            wparams = wake.QUICK if quick else wake.FULL
            (a50, a99), (b50, b99) = await session.pair(
                f"wake [{p}]", lambda: wake.rocketq_wake(broker, wparams),
                lambda: wake.redis_wake(redis_server, wparams), lambda side: (side, side))
            rows.append(Row(workload="wake latency p50", pairing=p, unit="ms", rocketq=a50, redis=b50))
            rows.append(Row(workload="wake latency p99", pairing=p, unit="ms", rocketq=a99, redis=b99,
                            target=("≤", 1.0)))
            rows.append(Row(workload="plain round trip p50, same spacing", pairing=p, unit="ms",
                            rocketq=Side(value=a99.details.get("rtt_floor_p50_ms", float("nan"))),
                            redis=Side(value=b99.details.get("rtt_floor_p50_ms", float("nan"))),
                            target=("≤", 1.2), note="rocketq GET_MAX_OFFSET, Redis PING"))


async def _send_row(session: Session, broker: Any, redis_server: RedisServer, pairing: str,
                    params: send.SendParams, name: str, workload: str, target: tuple[RatioOp, float], *,
                    batched: bool = False, body_bytes: int = 128, note: str = "") -> tuple[Side, Side]:
    """One send workload on both systems (topic / stream `name`), its row added; returns both sides."""
    a, b = await session.pair(
        f"{name} [{pairing}]",
        lambda: send.rocketq_send(broker, params, body_bytes, batched=batched, topic=name),
        lambda: send.redis_send(redis_server, params, body_bytes, batched=batched, stream=name), _same)
    session.rows.append(Row(workload=workload, pairing=pairing, unit="msg/s", rocketq=a, redis=b, target=target,
                            note=note))
    return a, b


def _cpu_rows(rows: list[Row], workload: str, pairing: str, a: Side, b: Side) -> None:
    """Server and client CPU µs per call of a single-send row, each followed by its kernel part
    (system CPU); the absolute targets hold in-memory."""
    for who, target in (("server", BROKER_US_PER_SEND), ("client", CLIENT_US_PER_SEND)):
        key = f"{who}_cpu_us_per_call"
        name = "broker" if who == "server" else "client"
        system = f"{who}_system_us_per_call"
        rows.append(Row(workload=f"{workload}: {name} CPU per send", pairing=pairing, unit="µs",
                        rocketq=Side(value=a.details.get(key, float("nan"))),
                        redis=Side(value=b.details.get(key, float("nan"))),
                        target=target if pairing == IN_MEMORY.name else None))
        rows.append(Row(workload=f"  of which kernel ({name})", pairing=pairing, unit="µs",
                        rocketq=Side(value=a.details.get(system, float("nan"))),
                        redis=Side(value=b.details.get(system, float("nan"))),
                        note="system CPU: the read, write and epoll calls and the wake-ups they cause"))


async def _floor_rows(session: Session, redis_server: RedisServer, pairing: str, redis_xadd: Side) -> None:
    """The CPU a round trip costs a server doing no work (`bench.peers.floor`): a Python uvloop
    process answering unparsed, beside Redis answering PING, through one identical client. What a
    single send costs the broker above this floor is its own handling. Then the minimal SEND
    server (frames in C, a body copy, no store: the bound of a request path in C) beside
    `redis_xadd`, the send row's Redis side."""
    params = floor.QUICK if session.opts.quick else floor.FULL

    async def python_floor() -> Side:
        async with floor.floor_server() as server:
            return await floor.round_trips(server.address, server, params)

    a, b = await session.pair(f"floor [{pairing}]", python_floor,
                              lambda: floor.round_trips(f"127.0.0.1:{redis_server.port}", redis_server, params),
                              _same)
    rows = session.rows
    rows.append(Row(workload="no-work round trip, 1 awaited at a time", pairing=pairing, unit="req/s",
                    rocketq=a, redis=b, note="rocketq column: a Python uvloop server answering every read "
                                             "unparsed (bench.peers.floor); Redis: PING"))
    for key, name in (("server_cpu_us_per_call", "  its server CPU per round trip"),
                      ("server_system_us_per_call", "  of which kernel")):
        rows.append(Row(workload=name, pairing=pairing, unit="µs",
                        rocketq=Side(value=a.details.get(key, float("nan"))),
                        redis=Side(value=b.details.get(key, float("nan"))),
                        note="the floor under the broker CPU per send row: the loop and the kernel alone"
                        if key == "server_cpu_us_per_call" else ""))

    async def minimal_send() -> Side:
        async with floor.floor_server(answer="send") as server:
            return await floor.send_round_trips(server.address, server, params)

    c = await session.attempt("rocketq", f"floor_send [{pairing}]", minimal_send, _same)
    rows.append(Row(workload="send 1 awaited at a time, minimal SEND server", pairing=pairing, unit="msg/s",
                    rocketq=c, redis=redis_xadd,
                    note="rocketq column: SEND answered with the frame functions (C when built) and a body "
                         "copy, no store (bench.peers.floor --answer send, ClientAPI.send_message_to): the bound "
                         "of a request path in C; Redis column: the send row's XADD"))
    for key, name in (("server_cpu_us_per_call", "  its server CPU per send"),
                      ("server_system_us_per_call", "  of which kernel")):
        rows.append(Row(workload=name, pairing=pairing, unit="µs",
                        rocketq=Side(value=c.details.get(key, float("nan"))),
                        redis=Side(value=redis_xadd.details.get(key, float("nan")))))


async def _consume(session: Session, broker: Any, redis_server: RedisServer, p: str) -> None:
    """The backlog rows. The headline pairs rocketq's async listener (one commit per pull) with
    Redis acking once per read of 32 (one XACK naming the 32 ids): the fair pairing, each side
    acknowledging once per fetch. rocketq's sync listener and Redis's pipelined XACK per entry are
    extra runs on the same backlogs (the other system's column repeats its headline number)."""
    params = consume.QUICK if session.opts.quick else consume.FULL
    topic = f"peers_backlog_{time.monotonic_ns()}"
    extra: dict[str, Side] = {}

    async def rocketq_async() -> Side:
        expected, fill = await consume.rocketq_fill(broker, topic, params)
        session.notes.append(f"consume [{p}]: rocketq backlog filled at {fill.rate:,.0f} msg/s (send_batch of 32)")
        side = await consume.rocketq_backlog(broker, topic, expected, "async", params)
        extra["sync"] = await session.attempt(
            "rocketq", f"consume x1 sync listener [{p}]",
            lambda: consume.rocketq_backlog(broker, topic, expected, "sync", params), _same)
        return side

    async def redis_one() -> Side:
        expected, fill = await consume.redis_fill(redis_server, topic, params)
        session.notes.append(f"consume [{p}]: Redis backlog filled at {fill.rate:,.0f} msg/s (pipelines of 32 XADD)")
        try:
            side = await consume.redis_backlog(redis_server, topic, expected, params, one_xack=True)
            extra["per_entry"] = await session.attempt(
                "redis", f"consume x1 XACK per entry [{p}]",
                lambda: consume.redis_backlog(redis_server, topic, expected, params), _same)
        finally:
            await consume.redis_delete(redis_server, topic)
        return side

    a, b = await session.pair(f"consume x1 [{p}]", rocketq_async, redis_one, _same)
    note = f"{params.backlog} messages"
    session.rows.append(Row(workload="1 consumer, backlog, async listener", pairing=p, unit="msg/s", rocketq=a,
                            redis=b, target=THROUGHPUT_TARGET,
                            note=f"{note}; Redis one XACK per read of 32, rocketq one commit per pull"))
    if "sync" in extra:
        session.rows.append(Row(workload="1 consumer, backlog, rq sync listener", pairing=p, unit="msg/s",
                                rocketq=extra["sync"], redis=b, note=f"extra; {note}; Redis as the row above"))
    if "per_entry" in extra:
        session.rows.append(Row(workload="1 consumer, backlog, Redis XACK/entry", pairing=p, unit="msg/s",
                                rocketq=a, redis=extra["per_entry"],
                                note=f"extra; {note}; Redis pipelined XACK per entry; rocketq as above"))


async def run_blocked(session: Session) -> None:
    params = blocked.QUICK if session.opts.quick else blocked.FULL

    async def rocketq() -> blocked.BlockedOutcome:
        async with running_broker(session.opts, IN_MEMORY.broker_settings) as broker:
            return await blocked.rocketq_blocked(broker, params)

    async def redis() -> blocked.BlockedOutcome:
        async with RedisServer(durable=False) as server:
            return await blocked.redis_blocked(server, params)

    a, b = await session.pair(f"{params.readers} blocked readers", rocketq, redis,
                              lambda side: blocked.BlockedOutcome(side, side, side))
    n, p = f"{params.readers:,} blocked readers", IN_MEMORY.name
    session.rows += [
        Row(workload=f"{n}: time to wake all", pairing=p, unit="ms", rocketq=a.wake_all, redis=b.wake_all,
            target=("≤", 0.25)),
        Row(workload=f"{n}: idle server CPU", pairing=p, unit="cores", rocketq=a.idle_cpu, redis=b.idle_cpu,
            target=("≤+", round(0.02 / params.measure_s, 4)),
            note=f"no higher, within 2 clock ticks (10 ms each) over {params.measure_s:g} s"),
        Row(workload=f"{n}: server RSS", pairing=p, unit="MB", rocketq=a.rss, redis=b.rss),
    ]


async def main_async(session: Session, pairings: list[Pairing], only: set[str]) -> None:
    for pairing in pairings:
        print(f"[peers] {pairing.label}", file=sys.stderr, flush=True)
        await run_pairing(session, pairing, only)
    if "blocked" in only:
        await run_blocked(session)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="reduced sizes (a smoke test, < 2 min)")
    parser.add_argument("--only", action="append", choices=WORKLOADS, metavar="WORKLOAD",
                        help=f"run only this workload (repeatable): {', '.join(WORKLOADS)}")
    parser.add_argument("--pairing", action="append", choices=sorted(PAIRINGS),
                        help="run only this pairing (repeatable; default both)")
    parser.add_argument("--system", choices=SYSTEMS, help="run one system only (for profiling)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[peers] %(levelname)s %(name)s: %(message)s")
    fds = raise_fd_limit()
    session = Session(Options.create(quick=args.quick, pin=False), (args.system,) if args.system else SYSTEMS)
    only = set(args.only or WORKLOADS)
    pairings = [PAIRINGS[name] for name in args.pairing] if args.pairing else [IN_MEMORY, DURABLE]
    started = time.perf_counter()
    run(main_async(session, pairings, only))
    elapsed = time.perf_counter() - started
    rows = session.rows
    print(format_table(rows))
    for pairing in pairings:
        print(f"pairing {pairing.label}")
    print(f"clients: rocketq client (uvloop); redis-py {version('redis')} asyncio + hiredis {version('hiredis')}; "
          f"server: {redis_version()}; RLIMIT_NOFILE {fds}")
    print(cpu_idle_line())
    for note in session.notes:
        print(f"note: {note}")
    missed = [f"{r.workload} [{r.pairing}] ({r.ratio:.2f}x)" for r in rows if r.passed is False]
    targeted = sum(1 for r in rows if r.passed is not None)
    print(f"targets met: {targeted - len(missed)} of {targeted}"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    params: dict[str, Any] = {
        "send_one": asdict(send.ONE_QUICK if args.quick else send.ONE_FULL),
        "send_batch": asdict(send.BATCH_QUICK if args.quick else send.BATCH_FULL),
        "consume": asdict(consume.QUICK if args.quick else consume.FULL),
        "wake": asdict(wake.QUICK if args.quick else wake.FULL),
        "blocked": asdict(blocked.QUICK if args.quick else blocked.FULL),
        "redis_py": version("redis"), "hiredis": version("hiredis"), "redis_server": redis_version(),
        "pairings": [p.label for p in pairings], "elapsed_s": round(elapsed, 1)}
    path = write_json(rows, quick=args.quick, notes=session.notes, params=params)
    print(f"results: {path} ({elapsed:.0f} s)")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
