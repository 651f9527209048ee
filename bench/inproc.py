"""The broker's own CPU per request, in process: `python -m bench.inproc {send,batch,send-back,wake-one,wake-all}`.

A `Broker` (ASYNC_FLUSH, a temporary store) runs in this process; pre-encoded request frames are
fed to `Broker.connection_protocol()` exactly as the TCP server would hand them over, through a
transport that drops what is written. No socket, no client and no other process share the
measurement, so it is the Python the broker runs per request, which is what the per-request work
of issue 14 cut (docs/performance.md, "Per-request cost", quotes it). Figures are µs (or ms) of this
thread's CPU (`time.thread_time`).

- `send`: `--count` single SENDs of 128 B on 8 queues, back to back ("hot"), or with
  `--idle-us` of sleep before each ("cold": the CPU's caches and predictors lose the broker's
  state while it waits, as between the requests of one producer awaiting each send).
- `batch`: SEND_BATCH of 32 messages of 128 B, back to back.
- `send-back`: `--count` CONSUMER_SEND_MSG_BACKs of stored 128 B messages (each looked up by its
  commit_log_offset and stored again in the group's retry topic, at its delay level), back to back
  or with `--idle-us` before each.
- `wake-one`: `--count` rounds of one held pull and one SEND that wakes it (`make bench-peers`'
  wake latency, broker side): the CPU of the SEND's handling, which reads and writes the woken
  pull's response before the send's own; `--idle-us` as for `send`. The difference from `send`
  is what waking one pull costs.
- `consume`: `--count` rounds of a pull that commits the queue offset the last one reached
  (COMMIT_OFFSET), held at the end of the queue, then a SEND that wakes it: what one message costs
  end to end when each pull finds one (`trace_cost`'s e2e row, `--trace on|off`).
- `wake-all`: 10,000 held pulls (10 on each of 1,000 queues, over 100 connections) woken by 1,000
  sends fed in reads of 16, as `make bench-peers`' blocked readers; the CPU of the wake phase.

`--auth` (send, batch) turns authentication and authorization on, every frame signed by a Normal
user allowed Pub on the topic: the difference is what checking a request costs the broker.
`--profile` prints cProfile's top functions of the measured phase (cProfile's own cost inflates
every figure; compare shares, not totals). Results are printed only: the benchmarks with targets
are `make bench` and `make bench-peers`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import operator
import statistics
import sys
import time

from bench.common import pull_header, run
from bench.inproc_harness import (
    BODY,
    QUEUES,
    InProcess,
    batch_frame,
    credentials,
    feed_one_at_a_time,
    profiled,
    send_frame,
    settle,
    steps_until,
    with_broker,
)
from conf.broker import BrokerConfig
from conf.store import StoreConfig
from protocol.codes import PullSysFlag, RequestCode
from protocol.command import RemotingCommand
from protocol.frame import encode_frame_bytes
from protocol.headers import ConsumerSendMsgBackRequestHeader


async def bench_send(args: argparse.Namespace) -> None:
    async def body(inproc: InProcess) -> None:
        await inproc.durable_topic("inproc", QUEUES)
        protocol, transport = await inproc.warmed_connection(
            send_frame("inproc", i % QUEUES, i + 1, uniq_key=f"7F000001{i:024X}", credentials=credentials(args))
            for i in range(2_000))
        idle_s = args.idle_us / 1e6
        await _trace_write_us(inproc, 1)                # (the warm-up's)
        for round_index in range(args.rounds):
            # every SEND its own UNIQ_KEY, as a producer's: each one is a new key-index entry
            frames = [send_frame("inproc", i % QUEUES, i + 1, uniq_key=f"7F000001{round_index + 1:08X}{i:016X}",
                                 credentials=credentials(args)) for i in range(args.count)]
            cpu = await feed_one_at_a_time(protocol, frames, idle_s,
                                            args.profile and round_index == args.rounds - 1)
            print(f"round {round_index}: {cpu / args.count * 1e6:.2f} µs of broker CPU per SEND "
                  f"({'idle ' + str(args.idle_us) + ' µs before each' if idle_s else 'back to back'}, "
                  f"{transport.writes} writes so far){await _trace_write_us(inproc, args.count)}")

    await with_broker(body, args)


async def _trace_write_us(inproc: InProcess, count: int, request_name: str = "SEND") -> str:
    """", and N µs per SEND to write its trace events" (the trace service's CPU in its writes,
    off the request path, since the last call: its periodic writes and one now); "" with the
    trace off."""
    trace = inproc.broker.trace
    if trace is None:
        return ""
    await trace.flush()
    spent_s, inproc.trace_write_s = trace.write_cpu_s - inproc.trace_write_s, trace.write_cpu_s
    return f", and {spent_s / count * 1e6:.2f} µs per {request_name} to write its trace events"


async def bench_batch(args: argparse.Namespace) -> None:
    async def body(inproc: InProcess) -> None:
        await inproc.durable_topic("inproc", QUEUES)
        protocol, _ = await inproc.warmed_connection(
            batch_frame("inproc", i % QUEUES, i + 1, credentials=credentials(args)) for i in range(200))
        count = max(1, args.count // 32)
        await _trace_write_us(inproc, 1)                # (the warm-up's)
        for round_index in range(args.rounds):
            # every message its own UNIQ_KEY, as a producer's: each one is a new key-index entry
            frames = [batch_frame("inproc", i % QUEUES, (round_index + 1) << 32 | i, credentials=credentials(args))
                      for i in range(count)]
            gc.collect()
            with profiled(args.profile and round_index == args.rounds - 1):
                started = time.thread_time()
                for i in range(count):
                    operator.call(protocol.data_received, frames[i])    # (the read `bench.instructions` counts)
                    if i & 63 == 63:
                        await asyncio.sleep(0)
                cpu = time.thread_time() - started
            print(f"round {round_index}: {cpu / count * 1e6:.1f} µs of broker CPU per SEND_BATCH of 32"
                  f"{await _trace_write_us(inproc, count, 'SEND_BATCH')}")

    await with_broker(body, args)


async def bench_wake_one(args: argparse.Namespace) -> None:
    await _held_pulls(args, consume=False)


async def bench_consume(args: argparse.Namespace) -> None:
    await _held_pulls(args, consume=True)


async def _held_pulls(args: argparse.Namespace, consume: bool) -> None:
    """`wake-one` (`consume` False): a pull held at the end of the queue, then the SEND that wakes
    it, measured; `consume`: the pull also commits the offset the last one reached and its read is
    measured too (what one message consumed one at a time costs)."""
    async def body(inproc: InProcess) -> None:
        await inproc.durable_topic("inproc_wake", 1)
        puller, pulled = inproc.connect()
        sender, _ = inproc.connect()
        hold = inproc.broker.hold_service
        assert hold is not None
        idle_s, opaque, queue_offset = args.idle_us / 1e6, 0, 0

        def round_trip(measure: bool) -> float:
            nonlocal opaque, queue_offset
            opaque += 2
            header = pull_header("inproc_wake", 0, queue_offset, suspend_timeout_ms=60_000)
            if consume:
                header = dataclasses.replace(header, sys_flag=header.sys_flag | int(PullSysFlag.COMMIT_OFFSET),
                                             commit_offset=queue_offset)
            pull = encode_frame_bytes(RemotingCommand(int(RequestCode.PULL_MESSAGE), opaque=opaque,
                                                      fields=header.to_fields()))
            if not consume:
                puller.data_received(pull)
                if hold.held_count != 1:
                    raise RuntimeError(f"{hold.held_count} pulls held, not 1")
            frame, writes = send_frame("inproc_wake", 0, opaque + 1), pulled.writes
            if measure and idle_s:
                time.sleep(idle_s)
            started = time.thread_time()
            if consume:
                operator.call(puller.data_received, pull)     # (the reads `bench.instructions` counts)
                if hold.held_count != 1:
                    raise RuntimeError(f"{hold.held_count} pulls held, not 1")
            operator.call(sender.data_received, frame)
            cpu = time.thread_time() - started
            if hold.held_count or pulled.writes == writes:
                raise RuntimeError("the SEND did not answer the held pull in its own handling")
            queue_offset += 1
            return cpu

        for _ in range(1_000):                          # warm-up
            round_trip(False)
            await asyncio.sleep(0)
        await _trace_write_us(inproc, 1)                # (the warm-up's)
        what = ("message consumed (a committing pull held, a SEND waking it)" if consume else
                "SEND waking one held pull")
        for round_index in range(args.rounds):
            gc.collect()
            cpu = 0.0
            with profiled(args.profile and round_index == args.rounds - 1):
                for _ in range(args.count):
                    cpu += round_trip(True)
                    await asyncio.sleep(0)              # the loop's callbacks (flushes) between round trips
            print(f"round {round_index}: {cpu / args.count * 1e6:.2f} µs of broker CPU per {what} "
                  f"({'idle ' + str(args.idle_us) + ' µs before each' if idle_s else 'back to back'})"
                  f"{await _trace_write_us(inproc, args.count)}")

    await with_broker(body, args)


async def bench_wake_all(args: argparse.Namespace) -> None:
    queues, per_queue, connections, per_read = 1_000, 10, 100, 16
    pulls_each = queues * per_queue // connections

    async def body(inproc: InProcess) -> None:
        topics = [f"inproc_held_{t}" for t in range(queues // 100)]
        for topic in topics:
            await inproc.durable_topic(topic, 100)
        pullers = [inproc.connect()[0] for _ in range(connections)]
        sender, _ = inproc.connect()
        hold = inproc.broker.hold_service
        assert hold is not None
        opaque = 0

        def sends() -> list[bytes]:
            nonlocal opaque
            opaque += queues
            return [send_frame(topics[q // 100], q % 100, opaque + q, b"held") for q in range(queues)]

        for frame in sends():                           # every queue at offset 1
            sender.data_received(frame)
        results = []
        for round_index in range(args.rounds):
            for c, puller in enumerate(pullers):        # pull i waits on queue i % 1,000
                frames = []
                for k in range(pulls_each):
                    q = (c * pulls_each + k) % queues
                    header = pull_header(topics[q // 100], q % 100, round_index + 1, suspend_timeout_ms=60_000)
                    opaque += 1
                    frames.append(encode_frame_bytes(RemotingCommand(
                        int(RequestCode.PULL_MESSAGE), opaque=opaque, fields=header.to_fields())))
                puller.data_received(b"".join(frames))
            await steps_until(lambda: hold.held_count == queues * per_queue,
                               f"fewer than {queues * per_queue:,} pulls are held")
            wake = sends()
            gc.collect()
            await settle()
            with profiled(args.profile and round_index == args.rounds - 1):
                started = time.thread_time()
                for first in range(0, queues, per_read):
                    sender.data_received(b"".join(wake[first:first + per_read]))
                    await asyncio.sleep(0)
                await steps_until(lambda: not hold.held_count,
                                   "some pulls are still held after the wake")
                cpu = time.thread_time() - started
            results.append(cpu * 1000)
            print(f"round {round_index}: {cpu * 1000:.1f} ms of broker CPU for 1,000 sends waking 10,000 pulls")
        print(f"median {statistics.median(results):.1f} ms over {len(results)} rounds")

    await with_broker(body, args)


async def bench_send_back(args: argparse.Namespace) -> None:
    async def body(inproc: InProcess) -> None:
        broker, store = inproc.broker, inproc.broker.store
        assert store is not None
        broker.topics.ensure("inproc", QUEUES)
        total = 2_000 + args.rounds * args.count
        offsets = []
        for i in range(total):                          # the originals, stored without a request
            result = store.put_message(topic="inproc", queue_id=i % QUEUES, body=BODY,
                                       properties={"UNIQ_KEY": f"7F000001{i:024X}"}, flag=0,
                                       born_timestamp=0, born_host="127.0.0.1:1")
            offsets.append(result.commit_log_offsets[0])

        def frames(first: int, count: int) -> list[bytes]:
            return [encode_frame_bytes(RemotingCommand(
                int(RequestCode.CONSUMER_SEND_MSG_BACK), opaque=first + i + 1,
                fields=ConsumerSendMsgBackRequestHeader(commit_log_offset=offsets[first + i], group="inproc_group",
                                                        origin_msg_id=f"7F00000100002A9F{offsets[first + i]:016X}",
                                                        origin_topic="inproc").to_fields()))
                for i in range(count)]

        protocol, _ = await inproc.warmed_connection(frames(0, 2_000))    # the retry topic made, caches filled
        idle_s = args.idle_us / 1e6
        for round_index in range(args.rounds):
            cpu = await feed_one_at_a_time(protocol, frames(2_000 + round_index * args.count, args.count), idle_s,
                                            args.profile and round_index == args.rounds - 1)
            print(f"round {round_index}: {cpu / args.count * 1e6:.2f} µs of broker CPU per CONSUMER_SEND_MSG_BACK "
                  f"({'idle ' + str(args.idle_us) + ' µs before each' if idle_s else 'back to back'})")

    await with_broker(body, args)


WORKLOADS = {"send": bench_send, "consume": bench_consume, "batch": bench_batch,
             "wake-one": bench_wake_one, "wake-all": bench_wake_all,
             "send-back": bench_send_back}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inproc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--count", type=int, default=20_000,
                        help="send, wake-one: SENDs per round; batch: messages per round (default 20,000)")
    parser.add_argument("--idle-us", type=float, default=0.0,
                        help="send, wake-one: sleep this many µs before each SEND (default 0: back to back)")
    parser.add_argument("--profile", action="store_true", help="cProfile the last round")
    parser.add_argument("--auth", action="store_true",
                        help="send, batch: authentication and authorization on, every request signed by a "
                             "Normal user allowed Pub on the topic (what checking it costs the broker)")
    parser.add_argument("--max-requests-per-step", type=int, default=BrokerConfig().max_requests_per_step,
                        help="the broker's max_requests_per_step (default: its default; 0: no bound)")
    parser.add_argument("--key-index-max-entries", type=int, default=StoreConfig().key_index_max_entries,
                        help="the store's key_index_max_entries (default: its default; 0: no key index, "
                             "to see what indexing each message's UNIQ_KEY costs)")
    parser.add_argument("--trace", choices=("on", "off"), default="on",
                        help="the message trace ([trace] enabled; default on, as the broker's default)")
    args = parser.parse_args(argv)
    if (args.rounds < 1 or args.count < 1 or args.idle_us < 0 or args.max_requests_per_step < 0
            or args.key_index_max_entries < 0):
        parser.error("--rounds and --count must be positive, --idle-us, --max-requests-per-step and "
                     "--key-index-max-entries not negative")
    run(WORKLOADS[args.workload](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
