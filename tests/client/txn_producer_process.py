"""A transaction producer in a process of its own, for a test that SIGKILLs it between the half
message and the commit: sends one transactional message whose local transaction never finishes,
prints its transaction id, then waits to be killed.

    python -m tests.client.txn_producer_process ADDRESS GROUP TOPIC BODY
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from client import LocalTransactionState, Message, MessageExt, TransactionProducer


class Stuck:
    def __init__(self, started: asyncio.Event) -> None:
        self.started = started

    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        self.started.set()
        await asyncio.Event().wait()        # never decides: killed first
        return LocalTransactionState.UNKNOW

    async def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW


async def main(address: str, group: str, topic: str, body: str) -> None:
    started = asyncio.Event()
    producer = TransactionProducer(group, address, Stuck(started))
    await producer.start()
    asyncio.get_running_loop().create_task(producer.send_message_in_transaction(Message(topic, body.encode())))
    await started.wait()
    print("HALF-SENT", flush=True)
    await asyncio.Event().wait()      # until killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
