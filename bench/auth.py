"""`auth_cost`: what authentication and authorization cost a producer, against a broker process with
both switches off and with both on (every request signed by a Normal user whose ACL allows Pub on
the topic: HMAC-SHA256 on both sides, the nonce cache and the ACL check on the broker).

- `auth.send_one.128B.<flush>.{off,on}`: one SEND_MESSAGE per request, `one_workers` in flight;
- `auth.send_batch.128B.<flush>.{off,on}`: SEND_BATCH_MESSAGE of 32, `batch_workers` in flight;
- `....on_vs_off`: throughput with auth on as a percentage of off (issue #37's targets: batched
  sends ≥ 90 %, single sends ≥ 75 %); `.broker_us_per_msg.{off,on}` and `.client_us_per_msg.*`:
  CPU per message of the broker and of this (client) process. A broker or client that is less busy
  writes fewer responses per system call, so its CPU per message grows when the other side slows.

Off and on alternate `rounds` times, each on its own fresh broker (the median of each is kept), so
a neighbour's load or a warm-up drift hits both alike. The client's connections are two
`RemotingClient`s, signing with `credentials` when on."""

from __future__ import annotations

import statistics
import time
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
    running_broker,
    synthetic_batches,
)
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
    queues: int = 8
    connections: int = 2
    body_bytes: int = 128


FULL = AuthParams(one_messages=60_000, one_workers=64, batch_messages=300_000, batch_workers=32, time_limit_s=6.0,
                  rounds=3)
QUICK = AuthParams(one_messages=6_000, one_workers=64, batch_messages=40_000, batch_workers=32, time_limit_s=2.0,
                   rounds=1)


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


async def measure(result: BenchResult, broker: BrokerProcess, kind: str, on: bool,
                  params: AuthParams) -> tuple[float, float, float]:
    """One run: messages/s, and broker and client CPU µs per message."""
    await prepare(broker.address, params, on)
    async with clients(broker.address, params.connections, PRODUCER if on else None) as apis:
        call, count, workers = await warmed_sender(kind, apis, broker.address, params)
        meter = CpuMeter(broker)
        meter.start()
        stats = await drive(range(count), call, workers=workers, time_limit_s=params.time_limit_s)
        cpu = meter.stop()
    note_neighbours(result, f"auth.{kind}.{'on' if on else 'off'}", cpu)
    if stats.errors:
        result.ok = False
        result.error = f"auth.{kind}: {stats.errors} failed sends, e.g. {stats.error_samples[:1]}"
    per_message_us = stats.elapsed_s / max(stats.messages, 1) * 1e6
    return stats.rate, cpu["broker_cores"] * per_message_us, cpu["client_cores"] * per_message_us


async def auth_cost(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "batch_size": BATCH_SIZE}
    result.notes.append("auth on: authentication and authorization, a Normal user with Pub on the topic")
    for flush in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        for kind in ("send_one", "send_batch"):
            rates: dict[bool, list[float]] = {False: [], True: []}
            cpu_us: dict[bool, list[float]] = {False: [], True: []}
            client_us: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(params.rounds):
                for on in (False, True):
                    settings = {"store.flush_disk_type": flush, **(AUTH_ON if on else {})}
                    async with running_broker(opts, settings) as broker:
                        rate, us, client = await measure(result, broker, kind, on, params)
                    rates[on].append(rate)
                    cpu_us[on].append(us)
                    client_us[on].append(client)
            label = f"auth.{kind}.{params.body_bytes}B.{flush}"
            off, on_rate = statistics.median(rates[False]), statistics.median(rates[True])
            result.add(f"{label}.off", round(off), "msg/s")
            result.add(f"{label}.on", round(on_rate), "msg/s")
            result.add(f"{label}.on_vs_off", round(100 * on_rate / off, 1), "%", ("≥", TARGET_PERCENT[kind]))
            for on in (False, True):
                result.add(f"{label}.broker_us_per_msg.{'on' if on else 'off'}",
                           round(statistics.median(cpu_us[on]), 2), "µs")
            for on in (False, True):
                result.add(f"{label}.client_us_per_msg.{'on' if on else 'off'}",
                           round(statistics.median(client_us[on]), 2), "µs")
            result.details[label] = {"rates_off": [round(r) for r in rates[False]],
                                     "rates_on": [round(r) for r in rates[True]],
                                     "broker_us_off": [round(u, 2) for u in cpu_us[False]],
                                     "broker_us_on": [round(u, 2) for u in cpu_us[True]],
                                     "client_us_off": [round(u, 2) for u in client_us[False]],
                                     "client_us_on": [round(u, 2) for u in client_us[True]],
                                     "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
