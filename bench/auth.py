"""`auth_cost`: what authentication and authorization cost a producer, against a broker process with
both switches off and with both on (every request signed by a Normal user whose ACL allows Pub on
the topic: HMAC-SHA256 on both sides, the nonce cache and the ACL check on the broker).

- `auth.send_one.128B.<flush>.{off,on}`: one SEND_MESSAGE per request, `one_workers` in flight;
- `auth.send_batch.128B.<flush>.{off,on}`: SEND_BATCH_MESSAGE of 32, `batch_workers` in flight;
- `....on_vs_off`: throughput with auth on as a percentage of off (issue #37's targets: batched
  sends ≥ 90 %, single sends ≥ 75 %); `.broker_us_per_msg.{off,on}` and `.client_us_per_msg.*`:
  CPU per message of the broker and of this (client) process. A broker or client that is less busy
  writes fewer responses per system call, so its CPU per message grows when the other side slows.

Each of `rounds` rounds starts a fresh broker with auth off and one with it on, side by side, and
sends to them in alternating slices of `*_messages` each (`bench.paired`): the ratio row is the
median over every adjacent pair of slices, the msg/s and CPU rows the medians of the slices. The
client's connections are two `RemotingClient`s per broker, signing with `credentials` for the
broker with auth on."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass

from bench.broker_proc import BrokerProcess
from bench.common import (
    BATCH_SIZE,
    PRODUCER_GROUP,
    CpuMeter,
    Options,
    batch_header,
    drive,
    note_neighbours,
    synthetic_batches,
)
from bench.paired import PairedRows, Slice, alternate, side_by_side
from bench.report import BenchResult
from client.admin_api import AdminAPI
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.bodies import AclEntryData
from protocol.headers import SendMessageRequestHeader
from protocol.signing import Credentials

ROOT = Credentials("bench-root", "bench-root-secret")
PRODUCER = Credentials("bench-producer", "bench-producer-secret")
TOPIC = "bench_auth"
TARGET_PERCENT = {"send_batch": 90.0, "send_one": 75.0}
AUTH_ON = {"auth.authentication_enabled": "true", "auth.authorization_enabled": "true",
           "auth.init_user": f"{ROOT.access_key}:{ROOT.secret_key}"}


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthParams:
    one_messages: int
    one_workers: int
    batch_messages: int
    batch_workers: int
    time_limit_s: float
    rounds: int
    slices: int = 1                # slices per broker per round (`bench.paired`)
    queues: int = 8
    connections: int = 2
    body_bytes: int = 128


# 48 pairs a row (~4.5 min): at 24, two runs of the same code read a batched row 89.0 and 93.6 %
FULL = AuthParams(one_messages=6_000, one_workers=64, batch_messages=96_000, batch_workers=32, time_limit_s=6.0,
                  rounds=6, slices=8)
QUICK = AuthParams(one_messages=2_000, one_workers=64, batch_messages=20_000, batch_workers=32, time_limit_s=2.0,
                   rounds=1, slices=2)


@asynccontextmanager
async def clients(address: str, count: int, credentials: Credentials | None) -> AsyncIterator[list[ClientAPI]]:
    apis = [ClientAPI(RemotingClient(credentials=credentials)) for _ in range(count)]
    try:
        for api in apis:
            await api.remoting.channel(address)
        yield apis
    finally:
        for api in apis:
            await api.remoting.close()


async def prepare(address: str, params: AuthParams, on: bool) -> None:
    """The topic (and, with auth on, the producer user with Pub on it), created as the Super user."""
    admin = AdminAPI(RemotingClient(credentials=ROOT if on else None))
    try:
        await admin.create_topic(address, TOPIC, queue_nums=params.queues)
        if on:
            await admin.create_user(address, PRODUCER.access_key, PRODUCER.secret_key)
            await admin.create_acl(address, f"User:{PRODUCER.access_key}",
                                   [AclEntryData(resource=f"Topic:{TOPIC}", actions=["Pub"])])
    finally:
        await admin.remoting.close()


def sender(kind: str, apis: list[ClientAPI], address: str, params: AuthParams) -> Callable[[int], Awaitable[int]]:
    if kind == "send_batch":
        bodies = synthetic_batches(TOPIC, params.body_bytes, BATCH_SIZE)
        headers = [batch_header(TOPIC, q) for q in range(params.queues)]

        async def batch(index: int) -> int:
            await apis[index % len(apis)].send_batch(address, headers[index % len(headers)],
                                                     bodies[index % len(bodies)], timeout_ms=10_000)
            return BATCH_SIZE
        return batch
    body = bytes(params.body_bytes)

    async def one(index: int) -> int:
        header = SendMessageRequestHeader(producer_group=PRODUCER_GROUP, topic=TOPIC, queue_id=index % params.queues,
                                          born_timestamp=0, properties={"UNIQ_KEY": f"BENCHAUTH{index:016X}"})
        await apis[index % len(apis)].send_message(address, header, body, timeout_ms=10_000)
        return 1
    return one


async def warmed_sender(kind: str, apis: list[ClientAPI], address: str,
                        params: AuthParams) -> tuple[Callable[[int], Awaitable[int]], int, int]:
    """`sender(kind, ...)` after a warm-up of 8 requests per queue (jobs 0 .. 8 x queues - 1), the
    requests a measured run makes and how many are in flight at once."""
    call = sender(kind, apis, address, params)
    warm = await drive(range(params.queues * 8), call, workers=params.queues, time_limit_s=10)
    if warm.errors:
        raise RuntimeError(f"warm-up sends failed: {warm.error_samples}")
    if kind == "send_batch":
        return call, params.batch_messages // BATCH_SIZE, params.batch_workers
    return call, params.one_messages, params.one_workers


async def measure_pair(result: BenchResult, brokers: dict[bool, BrokerProcess], kind: str,
                       params: AuthParams) -> dict[bool, list[Slice]]:
    """One round against a broker with auth off (False) and one with it on (True), both prepared
    and warmed first, `params.slices` slices each (`bench.paired.alternate`)."""
    async with contextlib.AsyncExitStack() as stack:
        runners = {}
        for on, broker in brokers.items():
            await prepare(broker.address, params, on)
            apis = await stack.enter_async_context(clients(broker.address, params.connections,
                                                           PRODUCER if on else None))
            runners[on] = slice_runner(result, broker, f"auth.{kind}.{'on' if on else 'off'}",
                                       *await warmed_sender(kind, apis, broker.address, params), params)
        return await alternate(runners, params.slices)


def slice_runner(result: BenchResult, broker: BrokerProcess, label: str, call: Callable[[int], Awaitable[int]],
                 count: int, workers: int, params: AuthParams) -> Callable[[int], Awaitable[Slice]]:
    """Slice i sends jobs [8 x queues + i x count, + count) (the warm-up's came before): messages/s,
    and broker and client CPU µs per message."""
    async def run(index: int) -> Slice:
        first = params.queues * 8 + index * count
        meter = CpuMeter(broker)
        meter.start()
        stats = await drive(range(first, first + count), call, workers=workers, time_limit_s=params.time_limit_s)
        cpu = meter.stop()
        note_neighbours(result, label, cpu)
        if stats.errors:
            result.ok = False
            result.error = f"{label}: {stats.errors} failed sends, e.g. {stats.error_samples[:1]}"
        per_message_us = stats.elapsed_s / max(stats.messages, 1) * 1e6
        return stats.rate, cpu["broker_cores"] * per_message_us, cpu["client_cores"] * per_message_us
    return run


async def auth_cost(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "batch_size": BATCH_SIZE}
    result.notes.append("auth on: authentication and authorization, a Normal user with Pub on the topic")
    result.notes.append("the broker with auth off and the one with it on run side by side, sent to in "
                        "alternating slices; on_vs_off is the median of adjacent slices' ratios")
    for flush in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        for kind in ("send_one", "send_batch"):
            rows = PairedRows()
            for round_index in range(params.rounds):
                off_settings = {"store.flush_disk_type": flush}
                async with side_by_side(opts, {False: off_settings, True: {**off_settings, **AUTH_ON}},
                                        round_index) as brokers:
                    rows.add_round(await measure_pair(result, brokers, kind, params))
            rows.report(result, f"auth.{kind}.{params.body_bytes}B.{flush}", TARGET_PERCENT[kind])
