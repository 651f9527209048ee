"""A push consumer in a process of its own, for tests that kill it: appends the UNIQ_KEY of every
message it consumed to a file (flushed per batch) and prints READY once it owns a queue.

    python -m tests.client.consumer_process ADDRESS GROUP TOPIC OUTFILE
"""

from __future__ import annotations

import asyncio
import sys

from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, MessageExt, PushConsumer
from conf.client import ClientConfig


async def main(address: str, group: str, topic: str, outfile: str) -> None:
    out = open(outfile, "a")  # noqa: SIM115 - kept open until the process is killed

    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        out.write("".join(f"{m.uniq_key}\n" for m in msgs))
        out.flush()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(group, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            client_config=ClientConfig(persist_offset_interval_ms=200))
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    await consumer.start()
    while not consumer.assigned_queues(topic):
        await asyncio.sleep(0.01)
    print("READY", flush=True)
    await asyncio.Event().wait()      # until killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
