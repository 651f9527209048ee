"""kill -9 of a broker with pending half messages: after the restart the check service, rebuilt
from the half and op topics, checks each one back and the producer's answers commit or roll them
back; what was resolved before the crash is neither checked nor delivered again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker.broker import Broker
from broker.process import BrokerSubprocess
from client import LocalTransactionState, Message, MessageExt, TransactionProducer
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.broker import BrokerConfig
from conf.client import ClientConfig
from conf.store import StoreConfig
from protocol.model import PullStatus
from tests.helpers import free_port, pull_header

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
PENDING = 20


class ByBody:
    """execute: the state passed as `arg`; check: COMMIT for bodies "c-..", ROLLBACK for "r-..",
    UNKNOW while `answering` is False."""

    def __init__(self) -> None:
        self.answering = False
        self.checked: list[bytes] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        assert isinstance(arg, LocalTransactionState)
        return arg

    def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        self.checked.append(message_ext.body)
        if not self.answering:
            return UNKNOW
        return COMMIT if message_ext.body.startswith(b"c-") else ROLLBACK


async def bodies_in(api: ClientAPI, address: str, topic: str) -> list[bytes]:
    found: list[bytes] = []
    queue_offset = 0
    while True:
        result = await api.pull_message(address, pull_header(topic=topic, queue_offset=queue_offset), 5_000)
        if result.status is not PullStatus.FOUND:
            return found
        found += [m.body for m in result.messages]
        queue_offset = result.next_begin_offset


async def test_kill_9_with_pending_half_messages_resolves_them_after_restart(tmp_path: Path) -> None:
    store, port = tmp_path / "store", free_port()
    quiet = {"transaction_check_interval_ms": "600000"}      # no check-back before the crash
    checking = {"transaction_check_interval_ms": "100", "transaction_timeout_ms": "200"}
    proc = BrokerSubprocess(store, settings=quiet, listen_port=port)
    await proc.start()
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    listener = ByBody()
    producer = TransactionProducer("kpg", proc.address, listener,
                                   client_config=ClientConfig(heartbeat_interval_ms=100))
    try:
        await api.create_topic(proc.address, "kt", queue_nums=1)
        await producer.start()
        await producer.send_message_in_transaction(Message("kt", b"before-commit"), COMMIT)
        await producer.send_message_in_transaction(Message("kt", b"before-rollback"), ROLLBACK)
        for i in range(PENDING):
            prefix = "c" if i % 2 == 0 else "r"
            result = await producer.send_message_in_transaction(Message("kt", f"{prefix}-{i}".encode()), UNKNOW)
            assert result.local_transaction_state is UNKNOW
        proc.kill()
        await proc.stop()
        assert (store / "abort").exists(), "a crash leaves the abort marker"

        listener.answering = True
        proc = BrokerSubprocess(store, settings=checking, listen_port=port)
        await proc.start()
        committed = sorted([b"before-commit"] + [f"c-{i}".encode() for i in range(0, PENDING, 2)])

        async def delivered() -> list[bytes]:
            return sorted(await bodies_in(api, proc.address, "kt"))
        async with asyncio.timeout(30):        # polled, as `wait_until` polls (each round is a pull)
            while await delivered() != committed:
                await asyncio.sleep(0.02)
        assert b"before-commit" not in listener.checked and b"before-rollback" not in listener.checked
    finally:
        await producer.shutdown()
        await proc.stop()
        await remoting.close()

    # the store again, in process: nothing pending, every committed message once
    config = BrokerConfig(listen_port=0, metrics_port=0, grpc_port=0, store=StoreConfig(path=store))
    async with Broker(config) as broker:
        assert broker.transactions is not None and broker.transactions.table.pending_count == 0
        assert broker.store is not None and broker.store.get_max_offset("kt", 0) == len(committed)
