"""`grpc_client`: RocketMQ's official Python client (`rocketmq-python-client`, unmodified) against
rocketq's gRPC API (`grpc_port`): its send throughput and its receive+ack throughput, and what each
costs in CPU per message, the client process's and the broker's apart.

One ASYNC_FLUSH broker subprocess serving the gRPC API; a topic of 8 queues; 128 B messages. Send:
one `Producer`, `send_async` with `SEND_WINDOW` (64) sends in flight. Receive: one `SimpleConsumer`
per `RECEIVERS` (4) threads, each looping `receive(32, 60 s)` and acking every message of a batch
through `ACKERS` (16) threads (the client's `ack_async` returns nothing to wait for, so acks are the
blocking `ack` in a pool), until every message sent was received and acked once. The client's CPU
is this process's over the phase (the official client runs its gRPC calls on its own event-loop
thread and its callbacks on thread pools: all of it is this process); the broker's is its process's.
Beside them, the same sends by rocketq's own `Producer` over the remoting port (`rocketq_send`, 64
in flight, into a topic of its own first), the baseline the gRPC path's broker CPU compares with. No
target: the figures say what a RocketMQ 5 client costs against rocketq."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from bench.broker_proc import BrokerProcess, free_port
from bench.common import CpuMeter, Options, note_neighbours, running_broker
from bench.report import BenchResult

TOPIC = "bench_grpc"
BASELINE_TOPIC = "bench_grpc_remoting"      # the baseline's own topic: the receive phase reads only the client's
GROUP = "bench_grpc_cg"
BODY = b"x" * 128
SEND_WINDOW = 64
RECEIVERS = 4
ACKERS = 16
FULL, QUICK = 20_000, 2_000


def _official() -> Any:
    import rocketmq  # imported here: `python -m bench --only other` never loads the gRPC stack
    logging.getLogger("rocketmq-python-client").setLevel(logging.ERROR)
    return rocketmq


def _config(endpoint: str) -> Any:
    rocketmq = _official()
    return rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials(), request_timeout=10)


def _send(endpoint: str, count: int) -> float:
    """Send `count` messages with `SEND_WINDOW` in flight; returns the seconds it took."""
    rocketmq = _official()
    producer = rocketmq.Producer(_config(endpoint), (TOPIC,))
    producer.startup()
    try:
        in_flight: deque[Future[Any]] = deque()
        started = time.perf_counter()
        for _ in range(count):
            if len(in_flight) >= SEND_WINDOW:
                in_flight.popleft().result(timeout=30)
            message = rocketmq.Message()
            message.topic, message.body = TOPIC, BODY
            in_flight.append(producer.send_async(message))
        while in_flight:
            in_flight.popleft().result(timeout=30)
        return time.perf_counter() - started
    finally:
        producer.shutdown()


def _receive(endpoint: str, count: int, time_limit_s: float) -> tuple[float, int, int]:
    """Receive and ack until `count` distinct messages were acked; (seconds, distinct, deliveries)."""
    rocketmq = _official()
    consumers = [rocketmq.SimpleConsumer(_config(endpoint), GROUP, {TOPIC: rocketmq.FilterExpression()},
                                         await_duration=1) for _ in range(RECEIVERS)]
    for consumer in consumers:
        consumer.startup()
    seen: set[str] = set()
    deliveries = [0]
    lock = threading.Lock()
    done = threading.Event()
    deadline = time.monotonic() + time_limit_s

    def loop(consumer: Any, pool: ThreadPoolExecutor) -> None:
        while not done.is_set() and time.monotonic() < deadline:
            batch = consumer.receive(32, 60)
            for future in [pool.submit(consumer.ack, m) for m in batch]:
                future.result(timeout=30)
            with lock:
                deliveries[0] += len(batch)
                seen.update(m.message_id for m in batch)
                if len(seen) >= count:
                    done.set()
    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(ACKERS) as pool:
            threads = [threading.Thread(target=loop, args=(c, pool)) for c in consumers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return time.perf_counter() - started, len(seen), deliveries[0]
    finally:
        for consumer in consumers:
            consumer.shutdown()


async def _rocketq_send(address: str, count: int) -> float:
    """The baseline: rocketq's own Producer, one message per send, `SEND_WINDOW` in flight."""
    from client.producer.producer import Producer
    from protocol.message import Message
    async with Producer("bench_grpc_pg", address) as producer:
        started = time.perf_counter()
        sent = [0]

        async def worker() -> None:
            while sent[0] < count:
                sent[0] += 1
                await producer.send(Message(BASELINE_TOPIC, BODY))
        await asyncio.gather(*(worker() for _ in range(SEND_WINDOW)))
        return time.perf_counter() - started


def _per_message_us(cores: float, seconds: float, messages: int) -> float:
    return round(cores * seconds / max(messages, 1) * 1e6, 1)


async def _phase(broker: BrokerProcess, result: BenchResult, name: str, work: Any, messages: int, *,
                 in_thread: bool = True) -> float:
    """Run `work` (blocking, in a thread; else a coroutine function) and record its rate and CPU."""
    meter = CpuMeter(broker)
    meter.start()
    outcome = await (asyncio.to_thread(work) if in_thread else work())
    cpu = meter.stop()
    seconds = outcome if isinstance(outcome, float) else outcome[0]
    result.add(f"{name}_rate", round(messages / seconds), "msg/s")
    result.add(f"{name}_client_cpu", _per_message_us(cpu["client_cores"], seconds, messages), "µs/msg")
    result.add(f"{name}_broker_cpu", _per_message_us(cpu["broker_cores"], seconds, messages), "µs/msg")
    result.details[name] = {"seconds": round(seconds, 3), "cpu": cpu}
    note_neighbours(result, name, cpu)
    return seconds


async def grpc_client(result: BenchResult, opts: Options) -> None:
    count = QUICK if opts.quick else FULL
    port = free_port()
    result.params.update(messages=count, body_bytes=len(BODY), send_window=SEND_WINDOW, receivers=RECEIVERS,
                         ackers=ACKERS, queues=8)
    async with running_broker(opts, settings={"grpc_port": str(port), "default_queue_nums": "8"}) as broker:
        endpoint = f"127.0.0.1:{port}"
        await _phase(broker, result, "rocketq_send", lambda: _rocketq_send(broker.address, count), count,
                     in_thread=False)
        await _phase(broker, result, "send", lambda: _send(endpoint, count), count)
        outcome: dict[str, tuple[float, int, int]] = {}

        def receive() -> float:
            outcome["r"] = _receive(endpoint, count, time_limit_s=120)
            return outcome["r"][0]
        await _phase(broker, result, "receive_ack", receive, count)
        _, distinct, deliveries = outcome["r"]
        result.details["receive_ack"].update(distinct=distinct, deliveries=deliveries)
        if distinct != count:
            result.ok = False
            result.error = f"received {distinct} of {count} messages"
        elif deliveries != count:
            result.notes.append(f"{deliveries - count} messages were delivered twice")
