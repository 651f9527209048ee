"""Consumption through each system's Python client, 128 B messages, every message handed to an
application callback that records it (that record is the delivery check) and acknowledged.

- backlog, 1 consumer: `backlog` messages are stored first (not measured), then one consumer reads
  them all. rocketq: a `PushConsumer` (pull batches of 32, the listener called per message,
  CONSUME_FROM_FIRST_OFFSET; acknowledgement is the consumer's offset commit, carried by its pulls
  and persisted at shutdown, then checked: committed offset = max offset on every queue). Redis:
  one loop of `XREADGROUP GROUP g c COUNT 32 BLOCK 100 STREAMS s >`, an `async def` handler awaited
  per entry, then one `XACK s g id1 .. id32` per read (checked afterwards: XPENDING = 0): each
  side acknowledges once per fetch, the fair pairing the headline ratio uses; an extra Redis run
  (a second group on the same stream) acknowledges with one `XACK s g id` per entry sent as one
  pipeline of 32 instead. The rate is the backlog over the time from the consumer's start until
  every message was handed to the application;
- end to end, 4 consumers: 4 members of one group (rocketq: 4 `PushConsumer`s splitting 8 queues;
  Redis: 4 loops as above, one XACK per read, on their own connections, one consumer group) run while a producer
  (`producers` tasks of batches of 32: `Producer.send_batch` / pipelines of 32 XADD) sends `e2e`
  messages as fast as it can; the rate is the messages over first send → last message consumed.
  Latency: consume time minus the server's store time (rocketq `store_timestamp`, the ms part of
  the Redis entry id; one machine, one clock, 1 ms resolution)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis

from bench.broker_proc import BrokerProcess
from bench.client_consume import wait_split
from bench.client_produce import create_topic, max_offsets
from bench.common import BATCH_SIZE, PRODUCER_GROUP, LoadStats, connected, drive
from bench.peers.results import Delivery, Side
from bench.peers.servers import RedisServer, ServerMeter
from bench.report import percentile
from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from client.consumer.listener import MessageListener
from protocol.codes import PullSysFlag
from protocol.headers import PullMessageRequestHeader
from protocol.model import PullStatus

K = TypeVar("K", bound=Hashable)
QUEUES = 8
BODY = bytes(128)
FIELD = b"body"
GROUP = "peers_cg"
SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeParams:
    backlog: int
    e2e: int
    consumers: int
    producers: int
    fill_workers: int
    time_limit_s: float


SEQ_FULL = ConsumeParams(backlog=200_000, e2e=0, consumers=1, producers=0, fill_workers=32, time_limit_s=40)
SEQ_QUICK = ConsumeParams(backlog=30_000, e2e=0, consumers=1, producers=0, fill_workers=32, time_limit_s=15)
FULL = ConsumeParams(backlog=200_000, e2e=200_000, consumers=4, producers=4, fill_workers=32, time_limit_s=40)
QUICK = ConsumeParams(backlog=30_000, e2e=30_000, consumers=4, producers=4, fill_workers=32, time_limit_s=15)


@dataclass(slots=True)
class Tally:
    """What the application callbacks saw: a key per message, and consume - store time in ms."""

    seen: list[Any] = field(default_factory=list)
    latencies_ms: list[int] = field(default_factory=list)

    def latency(self) -> dict[str, float]:
        ordered = sorted(self.latencies_ms)
        return {"latency_p50_ms": percentile(ordered, 0.5), "latency_p99_ms": percentile(ordered, 0.99)}


async def wait_all(seen: Sequence[K], expected: set[K], deadline: float) -> float | None:
    """perf_counter() once every expected key is in `seen` (polled every 2 ms), None at `deadline`."""
    checked = 0
    while time.perf_counter() < deadline:
        count = len(seen)
        if count >= len(expected) and count != checked:
            checked, at = count, time.perf_counter()
            if expected <= set(seen[:count]):
                return at
        await asyncio.sleep(0.002)
    return None


def _side(tally: Tally, expected: set[Any], started: float, done_at: float | None, cpu: dict[str, float],
          **details: Any) -> Side:
    elapsed = (done_at or time.perf_counter()) - started
    delivery = Delivery.of(expected, tally.seen)
    value = round(len(expected) / elapsed) if done_at is not None else float("nan")
    error = None if done_at is not None else f"not all consumed within the time limit ({elapsed:.1f} s)"
    return Side(value=value, delivery=delivery, error=error,
                details={"elapsed_s": round(elapsed, 3), **cpu, **tally.latency(), **details})


# -- rocketq ---------------------------------------------------------------------------------------------

def rocketq_listener(tally: Tally, kind: str) -> MessageListener:
    def record(msgs: list[MessageExt]) -> None:
        tally.seen.extend([m.queue_id << 32 | m.queue_offset for m in msgs])
        now_ms = time.time_ns() // 1_000_000
        tally.latencies_ms.extend([now_ms - m.store_timestamp for m in msgs])

    def sync_listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        record(msgs)
        return SUCCESS

    async def async_listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        record(msgs)
        return SUCCESS

    return async_listener if kind == "async" else sync_listener


@contextlib.asynccontextmanager
async def push_consumers(address: str, group: str, topic: str, count: int,
                         listener: MessageListener) -> AsyncIterator[list[PushConsumer]]:
    members = []
    for _ in range(count):
        consumer = PushConsumer(group, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                consume_message_batch_max_size=1, pull_batch_size=BATCH_SIZE)
        consumer.subscribe(topic, "*")
        consumer.register_listener(listener)
        members.append(consumer)
    try:
        await asyncio.gather(*(c.start() for c in members))
        yield members
    finally:
        await asyncio.gather(*(c.shutdown() for c in members), return_exceptions=True)


async def _rocketq_produce(address: str, topic: str, messages: int, workers: int, time_limit_s: float) -> LoadStats:
    async with Producer(PRODUCER_GROUP, address, send_msg_timeout_ms=10_000) as producer:
        async def call(index: int) -> int:
            await producer.send_batch([Message(topic=topic, body=BODY) for _ in range(BATCH_SIZE)])
            return BATCH_SIZE
        return await drive(range(messages // BATCH_SIZE), call, workers=workers, time_limit_s=time_limit_s)


async def _uncommitted(address: str, group: str, topic: str, offsets: list[int]) -> int:
    """Messages below the max offsets that the group's committed offsets do not cover."""
    async with connected(address, 1) as clients:
        committed = [await clients[0].query_consumer_offset(address, group, topic, q) for q in range(len(offsets))]
    return sum(max(0, top - done) for top, done in zip(offsets, committed, strict=True))


async def rocketq_fill(broker: BrokerProcess, topic: str, params: ConsumeParams) -> tuple[set[int], LoadStats]:
    await create_topic(broker.address, topic, QUEUES)
    stats = await _rocketq_produce(broker.address, topic, params.backlog, params.fill_workers, params.time_limit_s)
    offsets = await max_offsets(broker.address, topic, QUEUES)
    if stats.errors or sum(offsets) != stats.messages:
        raise RuntimeError(f"fill: {stats.errors} errors, {sum(offsets)} stored of {stats.messages} acknowledged")
    return {q << 32 | o for q, top in enumerate(offsets) for o in range(top)}, stats


async def rocketq_backlog(broker: BrokerProcess, topic: str, expected: set[int], kind: str,
                          params: ConsumeParams) -> Side:
    """One PushConsumer (`kind` "async" or "sync" listener) of a fresh group reads the backlog."""
    group = f"{GROUP}_backlog_{kind}_{time.monotonic_ns()}"
    tally = Tally()
    meter = ServerMeter(broker).start()
    started = time.perf_counter()
    async with push_consumers(broker.address, group, topic, 1, rocketq_listener(tally, kind)):
        done_at = await wait_all(tally.seen, expected, started + params.time_limit_s)
        cpu = meter.stop()
    offsets = await max_offsets(broker.address, topic, QUEUES)
    uncommitted = await _uncommitted(broker.address, group, topic, offsets)
    side = _side(tally, expected, started, done_at, cpu, uncommitted_after_shutdown=uncommitted,
                 listener=kind, ack="offset commit (in pulls, persisted at shutdown)")
    if uncommitted and side.error is None:
        side.error = f"{uncommitted} messages consumed but not committed after shutdown"
    return side


async def rocketq_e2e(broker: BrokerProcess, params: ConsumeParams) -> Side:
    address, topic = broker.address, f"peers_e2e_{time.monotonic_ns()}"
    group = f"{GROUP}_{topic}"
    await create_topic(address, topic, QUEUES)
    tally = Tally()
    async with push_consumers(address, group, topic, params.consumers, rocketq_listener(tally, "async")) as members:
        await wait_split(members, topic, QUEUES)
        meter = ServerMeter(broker).start()
        started = time.perf_counter()
        stats = await _rocketq_produce(address, topic, params.e2e, params.producers, params.time_limit_s)
        sent_at = time.perf_counter()
        offsets = await max_offsets(address, topic, QUEUES)
        expected = {q << 32 | o for q, top in enumerate(offsets) for o in range(top)}
        done_at = await wait_all(tally.seen, expected, started + params.time_limit_s + 10)
        cpu = meter.stop()
    side = _side(tally, expected, started, done_at, cpu, sent=stats.messages, send_errors=stats.errors,
                 send_rate=round(stats.messages / max(sent_at - started, 1e-9)))
    if stats.errors or sum(offsets) != stats.messages:
        side.error = f"{stats.errors} failed sends, {sum(offsets)} stored of {stats.messages} acknowledged"
    return side


async def rocketq_fetch_loop(broker: BrokerProcess, params: ConsumeParams) -> Side:
    """The sequential consume shape: one loop fetching 32 at a time (PULL_MESSAGE awaited, queues in
    turn) and committing once per fetch: each pull carries the queue's consumed offset
    (COMMIT_OFFSET, as RocketMQ's push consumer commits), a last UPDATE_CONSUMER_OFFSET per queue
    at the end; then the group's committed offsets must equal the max offsets."""
    topic = f"peers_fetch_{time.monotonic_ns()}"
    group = f"{GROUP}_fetch_{time.monotonic_ns()}"
    expected, _ = await rocketq_fill(broker, topic, params)
    address, tally = broker.address, Tally()
    async with connected(address, 1) as clients:
        api = clients[0]
        offsets = [0] * QUEUES
        done = [False] * QUEUES
        flag = int(PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET)
        meter = ServerMeter(broker).start()
        started = time.perf_counter()
        deadline = started + params.time_limit_s
        queue_id = 0
        while not all(done) and time.perf_counter() < deadline:
            queue_id = (queue_id + 1) % QUEUES
            if done[queue_id]:
                continue
            header = PullMessageRequestHeader(
                consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=offsets[queue_id],
                max_msg_nums=BATCH_SIZE, sys_flag=flag, commit_offset=offsets[queue_id], suspend_timeout_ms=0,
                sub_version=0, subscription="*", expression_type="TAG")
            result = await api.pull_message(address, header, 10_000)
            if result.status is not PullStatus.FOUND:
                done[queue_id] = result.next_begin_offset >= result.max_offset
                continue
            messages = result.messages
            tally.seen.extend([m.queue_id << 32 | m.queue_offset for m in messages])
            now_ms = time.time_ns() // 1_000_000
            tally.latencies_ms.extend([now_ms - m.store_timestamp for m in messages])
            offsets[queue_id] = result.next_begin_offset
        done_at = time.perf_counter() if all(done) else None
        cpu = meter.stop()
        for q in range(QUEUES):
            await api.update_consumer_offset(address, group, topic, q, offsets[q])
    top = await max_offsets(address, topic, QUEUES)
    uncommitted = await _uncommitted(address, group, topic, top)
    side = _side(tally, expected, started, done_at, cpu, uncommitted_after=uncommitted,
                 ack="offset commit carried by each pull")
    if uncommitted and side.error is None:
        side.error = f"{uncommitted} messages consumed but not committed"
    return side


async def redis_fetch_loop(server: RedisServer, params: ConsumeParams) -> Side:
    """The sequential consume shape on Redis: XREADGROUP COUNT 32, then one XACK of the 32 ids
    awaited, in one loop (the `one_xack` consumer on a fresh backlog)."""
    stream = f"peers_fetch_{time.monotonic_ns()}"
    expected, _ = await redis_fill(server, stream, params)
    try:
        return await redis_backlog(server, stream, expected, params, one_xack=True)
    finally:
        await redis_delete(server, stream)


# -- Redis -------------------------------------------------------------------------------------------------

def entries_of(response: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of an XREAD/XREADGROUP reply of one stream, RESP2 (list) or RESP3 (dict)."""
    if not response:
        return []
    streams = response.values() if isinstance(response, dict) else [s[1] for s in response]
    return [entry for entries in streams for entry in entries]


async def _redis_produce(server: RedisServer, stream: str, messages: int, workers: int,
                         time_limit_s: float, acked: list[bytes] | None = None) -> LoadStats:
    client = server.client(max_connections=workers + 2)
    try:
        async def call(index: int) -> int:
            pipe = client.pipeline(transaction=False)
            for _ in range(BATCH_SIZE):
                pipe.xadd(stream, {FIELD: BODY})
            ids = await pipe.execute()
            if acked is not None:
                acked.extend(ids)
            return BATCH_SIZE
        return await drive(range(messages // BATCH_SIZE), call, workers=workers, time_limit_s=time_limit_s)
    finally:
        await client.aclose()


async def redis_consumer(server: RedisServer, stream: str, group: str, name: str, tally: Tally,
                         stop: asyncio.Event, deadline: float, *, one_xack: bool = False) -> int:
    """XREADGROUP 32 / handle each / acknowledge until `stop` or `deadline`: one XACK per entry,
    the 32 sent as one pipeline, or with `one_xack` a single XACK naming the 32 ids. Returns the
    number of entries whose XACK did not count (acknowledged twice or unknown)."""
    client: aioredis.Redis = server.client(max_connections=1)
    bad_acks = 0

    async def handle(entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        tally.seen.append(entry_id)
        tally.latencies_ms.append(time.time_ns() // 1_000_000 - int(entry_id.split(b"-", 1)[0]))

    try:
        while not stop.is_set() and time.perf_counter() < deadline:
            entries = entries_of(await client.xreadgroup(group, name, {stream: ">"}, count=BATCH_SIZE, block=100))
            if not entries:
                continue
            for entry_id, fields in entries:
                await handle(entry_id, fields)
            if one_xack:
                bad_acks += len(entries) - await client.xack(stream, group, *[entry_id for entry_id, _ in entries])
                continue
            pipe = client.pipeline(transaction=False)
            for entry_id, _ in entries:
                pipe.xack(stream, group, entry_id)
            bad_acks += sum(1 for r in await pipe.execute() if r != 1)
    finally:
        await client.aclose()
    return bad_acks


async def redis_fill(server: RedisServer, stream: str, params: ConsumeParams) -> tuple[set[bytes], LoadStats]:
    acked: list[bytes] = []
    stats = await _redis_produce(server, stream, params.backlog, params.fill_workers, params.time_limit_s, acked)
    if stats.errors or len(set(acked)) != stats.messages:
        raise RuntimeError(f"fill: {stats.errors} errors, {len(set(acked))} ids for {stats.messages} messages")
    return set(acked), stats


async def _redis_command(server: RedisServer, command: str, *args: str) -> Any:
    client = server.client(max_connections=1)
    try:
        return await client.execute_command(command, *args)  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()


def _redis_consume(server: RedisServer, stream: str, group: str, count: int, tally: Tally, stop: asyncio.Event,
                   deadline: float, one_xack: bool = False) -> asyncio.Future[list[int]]:
    return asyncio.gather(*(redis_consumer(server, stream, group, f"c{i}", tally, stop, deadline, one_xack=one_xack)
                            for i in range(count)))


async def _redis_pending(server: RedisServer, stream: str, group: str) -> int:
    client = server.client(max_connections=1)
    try:
        return int((await client.xpending(stream, group))["pending"])
    finally:
        await client.aclose()


async def redis_delete(server: RedisServer, stream: str) -> None:
    await _redis_command(server, "DEL", stream)


async def redis_backlog(server: RedisServer, stream: str, expected: set[bytes], params: ConsumeParams, *,
                        one_xack: bool = False) -> Side:
    """A fresh group (from id 0) on the filled `stream`, read by one consumer."""
    group = f"{GROUP}_backlog_{int(one_xack)}"
    await _redis_command(server, "XGROUP", "CREATE", stream, group, "0")
    tally, stop = Tally(), asyncio.Event()
    meter = ServerMeter(server).start()
    started = time.perf_counter()
    consumers = _redis_consume(server, stream, group, 1, tally, stop, started + params.time_limit_s, one_xack)
    done_at = await wait_all(tally.seen, expected, started + params.time_limit_s)
    cpu = meter.stop()
    stop.set()
    bad_acks = sum(await consumers)
    pending = await _redis_pending(server, stream, group)
    ack = "one XACK of the 32 ids of a read" if one_xack else "XACK per entry, the 32 of a read in one pipeline"
    side = _side(tally, expected, started, done_at, cpu, pending_after=pending, bad_xack_replies=bad_acks, ack=ack)
    if (pending or bad_acks) and side.error is None:
        side.error = f"{pending} entries left pending, {bad_acks} XACK replies not 1"
    return side


async def redis_e2e(server: RedisServer, params: ConsumeParams) -> Side:
    stream = f"peers_e2e_{time.monotonic_ns()}"
    await _redis_command(server, "XGROUP", "CREATE", stream, GROUP, "$", "MKSTREAM")
    tally, stop, acked = Tally(), asyncio.Event(), list[bytes]()
    consumers = _redis_consume(server, stream, GROUP, params.consumers, tally, stop,
                               time.perf_counter() + params.time_limit_s + 15, one_xack=True)
    await asyncio.sleep(0.2)   # every consumer has its first XREADGROUP blocked
    meter = ServerMeter(server).start()
    started = time.perf_counter()
    stats = await _redis_produce(server, stream, params.e2e, params.producers, params.time_limit_s, acked)
    sent_at = time.perf_counter()
    expected = set(acked)
    done_at = await wait_all(tally.seen, expected, started + params.time_limit_s + 10)
    cpu = meter.stop()
    stop.set()
    bad_acks = sum(await consumers)
    pending = await _redis_pending(server, stream, GROUP)
    await redis_delete(server, stream)
    side = _side(tally, expected, started, done_at, cpu, sent=stats.messages, send_errors=stats.errors,
                 send_rate=round(stats.messages / max(sent_at - started, 1e-9)), pending_after=pending,
                 bad_xack_replies=bad_acks)
    if (stats.errors or pending or bad_acks) and side.error is None:
        side.error = f"{stats.errors} failed sends, {pending} left pending, {bad_acks} XACK replies not 1"
    return side
