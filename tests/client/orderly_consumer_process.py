"""An orderly push consumer in a process of its own, for the churn test: every listener call appends
one line to OUTFILE (one `os.write`, so a SIGKILL loses no line of a finished call):

    <client_id> <queue_id> <start_ns> <end_ns> <key>:<seq>,<key>:<seq>,...

with monotonic-clock times (CLOCK_MONOTONIC is system-wide, so they compare across processes).
Prints `READY <client_id>` once started; SIGTERM shuts the consumer down cleanly (a leave). The
listener is `async def`, or a plain `def` with `sync` (run in the consume service's threads,
several batches per thread hop).

    python -m tests.client.orderly_consumer_process ADDRESS GROUP TOPIC OUTFILE [async|sync]
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from client import ConsumeOrderlyContext, ConsumeOrderlyStatus, MessageExt, PushConsumer
from conf.client import ClientConfig

# Short lock times so a killed consumer's queues come back within seconds. The broker side of the
# test uses lock_max_live_ms = 5,000: renewal (1 s) < trust here (2.5 s) < broker expiry (5 s).
OPTIONS: dict[str, int] = {"lock_interval_ms": 1_000, "lock_max_live_time_ms": 2_500,
                           "unlock_delay_time_ms": 300, "pull_time_delay_when_exception_ms": 500}
CONFIG = ClientConfig(persist_offset_interval_ms=200, rebalance_interval_ms=1_000)


async def main(address: str, group: str, topic: str, outfile: str, kind: str = "async") -> None:
    fd = os.open(outfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    consumer = PushConsumer(group, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET", client_config=CONFIG,
                            **OPTIONS)  # type: ignore[arg-type]
    client_ids: list[str] = []             # the id stays known while shutting down

    def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        start_ns = time.monotonic_ns()
        if not client_ids:
            client_ids.append(consumer.client_id or "?")
        bodies = ",".join(m.body.decode() for m in msgs)
        line = f"{client_ids[0]} {ctx.message_queue.queue_id} {start_ns} {time.monotonic_ns()} {bodies}\n"
        os.write(fd, line.encode())
        return ConsumeOrderlyStatus.SUCCESS

    async def async_listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        return listener(msgs, ctx)

    consumer.subscribe(topic)
    consumer.register_listener(listener if kind == "sync" else async_listener, orderly=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await consumer.start()
    print("READY", consumer.client_id, flush=True)
    await stop.wait()
    await consumer.shutdown()
    os.close(fd)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
