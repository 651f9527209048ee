"""Client side shared by the benchmarks: connections, request builders, a bounded worker pool, and
the uvloop runner. Every loop here stops by itself: on a count, a deadline, or too many errors."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import uvloop

from bench.broker_proc import BrokerProcess, Usage
from bench.report import BenchResult
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.codes import PullSysFlag
from protocol.headers import PullMessageRequestHeader, SendBatchMessageRequestHeader, SendMessageRequestHeader
from protocol.message import Message, encode_batch_body

T = TypeVar("T")
J = TypeVar("J")
MAX_ERRORS = 50
BATCH_SIZE = 32
PRODUCER_GROUP = "bench_pg"
CONSUMER_GROUP = "bench_cg"


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How to run: `quick` reduced sizes; with `pin`, `broker_cpus` and `client_cpus` are the last
    and the first CPU this process may use (None: the OS decides). On a VM whose idle vCPUs wake
    slowly, a request/response ping-pong across CPUs can cost more than sharing one, so pinning is
    not always faster."""

    quick: bool = False
    broker_cpus: frozenset[int] | None = None
    client_cpus: frozenset[int] | None = None

    @classmethod
    def create(cls, *, quick: bool, pin: bool) -> Options:
        allowed = sorted(os.sched_getaffinity(0))
        if not pin or len(allowed) < 2:
            return cls(quick=quick)
        return cls(quick=quick, broker_cpus=frozenset(allowed[-1:]), client_cpus=frozenset(allowed[:1]))

    @property
    def pinned(self) -> bool:
        return self.broker_cpus is not None

    def pin_client(self) -> None:
        """Pin the calling thread (the client's event loop) to `client_cpus`, if set."""
        if self.client_cpus is not None:
            os.sched_setaffinity(0, self.client_cpus)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on a fresh uvloop event loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def store_root() -> Path:
    """Where broker stores go: $RQ_BENCH_DIR, else the system temp directory."""
    return Path(os.environ.get("RQ_BENCH_DIR") or tempfile.gettempdir())


@asynccontextmanager
async def running_broker(opts: Options, settings: dict[str, str] | None = None,
                         command: Sequence[str] | None = None) -> AsyncIterator[BrokerProcess]:
    """A broker subprocess on a fresh temporary store, stopped (and the store removed) on exit."""
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-", dir=store_root()) as directory:
        broker = BrokerProcess(Path(directory) / "store", settings=settings, command=command,
                               cpus=opts.broker_cpus)
        async with broker:
            yield broker


class Clients:
    """`count` independent connections (one `RemotingClient` each) to one broker."""

    def __init__(self, count: int, *, max_frame_bytes: int = 64 << 20) -> None:
        self.apis = [ClientAPI(RemotingClient(max_frame_bytes=max_frame_bytes)) for _ in range(count)]

    def __getitem__(self, index: int) -> ClientAPI:
        return self.apis[index % len(self.apis)]

    def __len__(self) -> int:
        return len(self.apis)

    async def connect(self, address: str) -> None:
        await asyncio.gather(*(api.remoting.channel(address) for api in self.apis))

    async def close(self) -> None:
        await asyncio.gather(*(api.remoting.close() for api in self.apis), return_exceptions=True)


@asynccontextmanager
async def connected(address: str, count: int) -> AsyncIterator[Clients]:
    clients = Clients(count)
    try:
        await clients.connect(address)
        yield clients
    finally:
        await clients.close()


@asynccontextmanager
async def broker_with_clients(opts: Options, connections: int, settings: dict[str, str] | None = None,
                              command: Sequence[str] | None = None,
                              ) -> AsyncIterator[tuple[BrokerProcess, Clients]]:
    """`running_broker` and `connections` connections to it (`connected`), closed on exit."""
    async with running_broker(opts, settings, command) as broker, connected(broker.address, connections) as clients:
        yield broker, clients


def pull_header(topic: str, queue_id: int, queue_offset: int, *, max_msg_nums: int = 32,
                suspend_timeout_ms: int = 0, group: str = CONSUMER_GROUP) -> PullMessageRequestHeader:
    """A pull carrying its own "*" subscription (no heartbeat needed); SUSPEND when
    `suspend_timeout_ms` > 0."""
    sys_flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_timeout_ms > 0 else 0)
    return PullMessageRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id,
                                    queue_offset=queue_offset, max_msg_nums=max_msg_nums,
                                    sys_flag=int(sys_flag), commit_offset=0,
                                    suspend_timeout_ms=suspend_timeout_ms, sub_version=0, subscription="*",
                                    expression_type="TAG")


def batch_header(topic: str, queue_id: int) -> SendBatchMessageRequestHeader:
    return SendBatchMessageRequestHeader(producer_group=PRODUCER_GROUP, topic=topic, queue_id=queue_id,
                                         born_timestamp=time.time_ns() // 1_000_000)


def synthetic_batches(topic: str, body_bytes: int, batch_size: int, distinct: int = 64) -> list[bytes]:
    """`distinct` pre-encoded SEND_BATCH_MESSAGE bodies of `batch_size` messages with a tag, a key
    and a unique key each, so the client spends its time sending rather than encoding."""
    bodies = []
    for b in range(distinct):
        messages = [Message(topic=topic, body=bytes([(b + i) % 251]) * body_bytes, tags="TagA",
                            keys=f"k{b}-{i}", properties={"UNIQ_KEY": f"BENCH{b:08X}{i:08X}"})
                    for i in range(batch_size)]
        bodies.append(encode_batch_body(messages))
    return bodies


async def send_batches(clients: Clients, address: str, topic: str, queues: int, bodies: Sequence[bytes], count: int,
                       *, workers: int, time_limit_s: float,
                       on_sent: Callable[[int, int, int], None] | None = None) -> LoadStats:
    """`count` SEND_BATCH_MESSAGE requests to `topic`, request `index` carrying `bodies[index %
    len(bodies)]` to queue `index % queues` on connection `clients[index]`, `workers` in flight (see
    `drive`); `on_sent(index, queue_id, messages)` after each acknowledged one."""
    headers = [batch_header(topic, q) for q in range(queues)]

    async def send(index: int) -> int:
        queue_id = index % queues
        sent = await clients[index].send_batch(address, headers[queue_id], bodies[index % len(bodies)],
                                               timeout_ms=10_000)
        messages = len(sent.msg_ids)
        if on_sent is not None:
            on_sent(index, queue_id, messages)
        return messages

    return await drive(range(count), send, workers=workers, time_limit_s=time_limit_s)


@dataclass(slots=True)
class LoadStats:
    """What a worker pool did: `messages` acknowledged, `requests` answered, failures."""

    messages: int = 0
    requests: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    timed_out: bool = False
    error_samples: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed_s if self.elapsed_s > 0 else float("nan")


async def drive(jobs: Iterable[J], call: Callable[[J], Awaitable[int]], *, workers: int,
                time_limit_s: float) -> LoadStats:
    """Run `call(job)` for the jobs, `workers` at a time, until the jobs run out, `time_limit_s`
    passes (no new job starts after it) or MAX_ERRORS calls failed. `call` returns how many
    messages it completed."""
    stats = LoadStats()
    source: Iterator[J] = iter(jobs)
    started = time.perf_counter()
    deadline = started + time_limit_s

    async def worker() -> None:
        for job in source:
            if time.perf_counter() >= deadline:
                stats.timed_out = True
                return
            try:
                done = await call(job)   # not `+= await`: that reads the total before awaiting
                stats.messages += done
                stats.requests += 1
            except Exception as exc:
                stats.errors += 1
                if len(stats.error_samples) < 5:
                    stats.error_samples.append(f"{type(exc).__name__}: {exc}")
                if stats.errors >= MAX_ERRORS:
                    return

    # the hard bound: a call that hangs cannot outlive its RPC timeout plus a margin
    async with asyncio.timeout(time_limit_s + 60):
        await asyncio.gather(*(worker() for _ in range(workers)))
    stats.elapsed_s = time.perf_counter() - started
    return stats


def _system_busy_s() -> float:
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0))


class CpuMeter:
    """Broker and client (this process) CPU over an interval, in cores, and what every other
    process on the machine used meanwhile (`others_cores`: a noisy neighbour skews the numbers)."""

    def __init__(self, broker: BrokerProcess) -> None:
        self._broker = broker
        self._me = psutil.Process()
        self._broker_start: Usage | None = None
        self._client_start = (0.0, 0.0)
        self._system_start = 0.0

    def _client_cpu(self) -> tuple[float, float]:
        times = self._me.cpu_times()
        return times.user + times.system, time.monotonic()

    def start(self) -> None:
        self._broker_start = self._broker.usage()
        self._client_start = self._client_cpu()
        self._system_start = _system_busy_s()

    def stop(self) -> dict[str, float]:
        """{"broker_cores", "client_cores", "others_cores", "broker_rss_mb"} since `start`."""
        assert self._broker_start is not None
        broker_now = self._broker.usage()
        client_cpu, client_at = self._client_cpu()
        system_busy = _system_busy_s()
        elapsed = client_at - self._client_start[1]
        if elapsed <= 0:
            elapsed = float("nan")
        broker_cores = broker_now.cores_since(self._broker_start)
        client_cores = (client_cpu - self._client_start[0]) / elapsed
        others = (system_busy - self._system_start) / elapsed - broker_cores - client_cores
        return {"broker_cores": round(broker_cores, 3), "client_cores": round(client_cores, 3),
                "others_cores": round(max(others, 0.0), 3),
                "broker_rss_mb": round(broker_now.rss_bytes / (1 << 20), 1)}


async def send_to_each_queue(senders: Clients, address: str, topics: Sequence[str], queues_per_topic: int,
                             time_limit_s: float) -> LoadStats:
    """One small message (tag "held") to every queue of `topics`, 64 in flight; raises
    RuntimeError when a send fails."""
    queues = len(topics) * queues_per_topic

    async def send(index: int) -> int:
        topic, queue_id = topics[index // queues_per_topic], index % queues_per_topic
        header = SendMessageRequestHeader(producer_group=PRODUCER_GROUP, topic=topic, queue_id=queue_id,
                                          born_timestamp=0, properties={"TAGS": "held"})
        await senders[index].send_message(address, header, b"held", timeout_ms=30_000)
        return 1

    stats = await drive(range(queues), send, workers=64, time_limit_s=time_limit_s)
    if stats.errors or stats.messages != queues:
        raise RuntimeError(f"sent {stats.messages} of {queues} messages: {stats.error_samples}")
    return stats


async def settle(usage: Callable[[], Usage], min_s: float, max_s: float) -> float:
    """Wait `min_s`, then until a 1 s window of `usage()` (a server's) shows at most one 10 ms CPU
    tick, `max_s` in all at most; returns the seconds waited."""
    started = time.monotonic()
    await asyncio.sleep(min_s)
    while time.monotonic() - started < max_s:
        before = usage()
        await asyncio.sleep(1.0)
        if usage().cores_since(before) <= 0.011:
            break
    return time.monotonic() - started


def wait_for_quiet(max_wait_s: float = 20.0, threshold_cores: float = 0.3) -> float:
    """Block until the machine used less than `threshold_cores` over a 1 s window (other sessions'
    tests or benchmarks skew every number), at most `max_wait_s`; returns the last window's cores."""
    deadline = time.monotonic() + max_wait_s
    while True:
        busy, started = _system_busy_s(), time.monotonic()
        time.sleep(1.0)
        cores = (_system_busy_s() - busy) / (time.monotonic() - started)
        if cores < threshold_cores or time.monotonic() >= deadline:
            return cores


@contextmanager
def cpu_measured(result: BenchResult, broker: BrokerProcess, label: str) -> Iterator[dict[str, float]]:
    """`CpuMeter.stop`'s numbers over the `with` block, in the dict it gives (filled on a normal
    exit), with `note_neighbours(result, label, ...)`."""
    meter = CpuMeter(broker)
    meter.start()
    cpu: dict[str, float] = {}
    yield cpu
    cpu.update(meter.stop())
    note_neighbours(result, label, cpu)


def note_neighbours(result: BenchResult, label: str, cpu: dict[str, float], limit: float = 0.2) -> None:
    """A note when other processes used more than `limit` cores during a measurement."""
    if cpu.get("others_cores", 0.0) > limit:
        result.notes.append(f"{label}: other processes used {cpu['others_cores']:.2f} cores meanwhile "
                            f"(the machine has {os.cpu_count()}); the number is pessimistic")
