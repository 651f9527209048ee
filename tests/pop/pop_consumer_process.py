"""A `SimpleConsumer` in a process of its own, for tests that kill it -9: receives batches with a
2 s invisible duration, appends each message's body to OUTFILE (flushed) before acking it, one at
a time in batch order, slowly (20 ms each), so a kill leaves messages popped and not acked.

    python -m tests.pop.pop_consumer_process ADDRESS GROUP TOPIC OUTFILE
"""

from __future__ import annotations

import asyncio
import sys

from client import SimpleConsumer


async def main(address: str, group: str, topic: str, outfile: str) -> None:
    out = open(outfile, "a")  # noqa: SIM115 - kept open until the process is killed
    async with SimpleConsumer(group, address, subscriptions={topic: "*"}, await_duration_s=1) as consumer:
        print("READY", flush=True)
        while True:
            for message in await consumer.receive(8, invisible_duration_s=2):
                out.write(message.body.decode() + "\n")
                out.flush()
                await asyncio.sleep(0.02)     # the work
                await consumer.ack(message)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
