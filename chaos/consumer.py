"""A chaos consumer process: a push consumer that appends `<body> <time_ns>` (the body is the
message key) for every message it consumed successfully to OUTFILE, flushed before the listener
returns, and prints READY once started.

    python -m chaos.consumer ADDRESS GROUP TOPIC OUTFILE concurrent|orderly

Concurrent mode fails 1 % of messages once (chosen by the key's CRC, first delivery only) with
RECONSUME_LATER and delay level 1, so the retry path (send-back, %RETRY%) runs. Offsets are
persisted every 500 ms and heartbeats sent every second, so faults cost seconds, not minutes."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import zlib

from client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageExt,
    PushConsumer,
)
from conf.client import ClientConfig

FAIL_ONCE_PERCENT = 1


def fails_once(key: bytes) -> bool:
    return zlib.crc32(key) % 100 < FAIL_ONCE_PERCENT


async def main(address: str, group: str, topic: str, outfile: str, mode: str) -> None:
    out = open(outfile, "ab")  # noqa: SIM115 - kept open for the life of the process

    def record(msgs: list[MessageExt]) -> None:
        stamp = b" %d\n" % time.time_ns()
        out.write(b"".join(m.body + stamp for m in msgs))
        out.flush()

    def concurrent(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        for message in msgs:
            if message.reconsume_times == 0 and fails_once(message.body):
                ctx.delay_level_when_next_consume = 1
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
        record(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def orderly(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        record(msgs)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(group, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            client_config=ClientConfig(heartbeat_interval_ms=1_000, persist_offset_interval_ms=500,
                                                       rebalance_interval_ms=2_000))
    consumer.subscribe(topic)
    if mode == "orderly":
        consumer.register_listener(orderly, orderly=True)
    else:
        consumer.register_listener(concurrent)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await consumer.start()
    print("READY", flush=True)
    await stop.wait()
    await consumer.shutdown()
    out.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
