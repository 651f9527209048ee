"""TransactionProducer against a real broker: commit delivers once, rollback never, UNKNOW then a
check-back, the check going to another producer of the group when the first one's connection is
gone, a listener slower than the check interval, the last check dropped and counted, a graceful
stop, and END_TRANSACTION refusals (duplicate, unknown, out of range, a body)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.broker import Broker
from client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    PushConsumer,
    TransactionProducer,
)
from client.api import ClientAPI
from conf.client import ClientConfig
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import MQError, SystemError_
from protocol.headers_v5 import EndTransactionRequestHeader
from protocol.message import parse_msg_id
from protocol.topics import TRANS_HALF_TOPIC
from tests.conftest import broker_config
from tests.helpers import pull_header, wait_until

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
FAST = ClientConfig(persist_offset_interval_ms=200)


class Listener:
    """execute returns `execute` (or what `decide[body]` says); check returns `check`; both count."""

    def __init__(self, execute: LocalTransactionState = COMMIT, check: LocalTransactionState = UNKNOW) -> None:
        self.execute, self.check = execute, check
        self.executed: list[bytes] = []
        self.checked: list[MessageExt] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        self.executed.append(bytes(message.body))
        return arg if isinstance(arg, LocalTransactionState) else self.execute

    def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        self.checked.append(message_ext)
        return self.check


class Delivered:
    def __init__(self) -> None:
        self.bodies: Counter[bytes] = Counter()
        self.lock = threading.Lock()

    def __call__(self, msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        with self.lock:
            self.bodies.update(bytes(m.body) for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


@pytest.fixture
async def txn_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    config = broker_config(tmp_path, transaction_timeout_ms=300, transaction_check_interval_ms=100,
                           transaction_check_max=5)
    async with Broker(config) as running:
        yield running


async def consumed(broker: Broker, topic: str, group: str = "cg") -> tuple[PushConsumer, Delivered]:
    delivered = Delivered()
    consumer = PushConsumer(group, broker.address, client_config=FAST, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(topic)
    consumer.register_listener(delivered)
    await consumer.start()
    return consumer, delivered


async def test_commit_delivers_once_and_rollback_never(txn_broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(txn_broker.address, "tx", queue_nums=1)
    consumer, delivered = await consumed(txn_broker, "tx")
    listener = Listener()
    try:
        async with TransactionProducer("tpg", txn_broker.address, listener) as producer:
            rolled = await producer.send_message_in_transaction(Message("tx", b"rolled-back"), ROLLBACK)
            committed = await producer.send_message_in_transaction(Message("tx", b"committed"), COMMIT)
            assert rolled.local_transaction_state is ROLLBACK and committed.local_transaction_state is COMMIT
            assert committed.transaction_id and committed.message_queue.topic == "tx"
            await wait_until(lambda: delivered.bodies[b"committed"] == 1, 5.0, "the committed message delivered")
        assert txn_broker.store is not None
        assert txn_broker.store.get_max_offset("tx", 0) == 1, "only the committed message is in the real queue"
        assert b"rolled-back" not in delivered.bodies
        pulled = (await client_api.pull_message(txn_broker.address, pull_header(topic="tx"), 3_000)).messages
        assert [m.body for m in pulled] == [b"committed"]
        assert pulled[0].sys_flag == 8 and pulled[0].uniq_key == committed.transaction_id   # COMMIT_TYPE
        assert "REAL_TOPIC" not in pulled[0].properties and pulled[0].properties["TRAN_MSG"] == "true"
        assert txn_broker.transactions is not None and txn_broker.transactions.table.pending_count == 0
        assert listener.checked == [], "nothing was left for a check-back"
    finally:
        await consumer.shutdown()


async def test_half_messages_are_invisible_until_commit(txn_broker: Broker, client_api: ClientAPI) -> None:
    gate = asyncio.Event()

    class Waiting(Listener):
        async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:  # type: ignore[override]
            await gate.wait()
            return COMMIT

    await client_api.create_topic(txn_broker.address, "inv", queue_nums=1)
    async with TransactionProducer("ipg", txn_broker.address, Waiting()) as producer:
        send = asyncio.create_task(producer.send_message_in_transaction(Message("inv", b"later")))
        assert txn_broker.transactions is not None
        await wait_until(lambda: txn_broker.transactions.table.pending_count == 1, 5.0, "half stored")  # type: ignore[union-attr]
        assert txn_broker.store is not None and txn_broker.store.get_max_offset("inv", 0) == 0
        with pytest.raises(MQError, match="TOPIC_NOT_EXIST"):      # no consumer can read the half topic
            await client_api.pull_message(txn_broker.address, pull_header(topic=TRANS_HALF_TOPIC), 3_000)
        rendered = (await txn_broker.metrics.render()).decode()
        assert 'rocketq_transaction_pending_messages{cluster="DefaultCluster",node_id="broker-a"} 1.0' in rendered
        gate.set()
        await send
    assert txn_broker.store.get_max_offset("inv", 0) == 1


async def test_unknow_then_check_back_commits_once(txn_broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(txn_broker.address, "ck", queue_nums=1)
    consumer, delivered = await consumed(txn_broker, "ck")
    listener = Listener(execute=UNKNOW, check=COMMIT)
    try:
        async with TransactionProducer("cpg", txn_broker.address, listener) as producer:
            result = await producer.send_message_in_transaction(Message("ck", b"checked", tags="T"))
            assert result.local_transaction_state is UNKNOW
            await wait_until(lambda: delivered.bodies[b"checked"] == 1, 10.0, "committed by the check-back")
            assert listener.checked[0].topic == "ck" and listener.checked[0].tags == "T"
            assert listener.checked[0].properties.get("UNIQ_KEY") == result.transaction_id
            check_service = txn_broker.transaction_check
            assert check_service is not None
            sent = check_service.checks_sent
            await wait_until(lambda: check_service.checks_sent == sent, 1.0)
        assert txn_broker.store is not None and txn_broker.store.get_max_offset("ck", 0) == 1, "delivered once"
    finally:
        await consumer.shutdown()
    assert delivered.bodies[b"checked"] == 1


async def test_check_goes_to_another_producer_when_the_first_is_gone(txn_broker: Broker,
                                                                     client_api: ClientAPI) -> None:
    await client_api.create_topic(txn_broker.address, "ho", queue_nums=1)
    first_listener, second_listener = Listener(execute=UNKNOW, check=UNKNOW), Listener(check=COMMIT)
    first = TransactionProducer("hpg", txn_broker.address, first_listener)
    second = TransactionProducer("hpg", txn_broker.address, second_listener)
    await first.start()
    await second.start()
    try:
        await first.send_message_in_transaction(Message("ho", b"orphan"))
        # the first producer's process "dies": its connection closes without unregistering
        instance = first._instance
        assert instance is not None
        await instance.remoting.close()
        await wait_until(lambda: len(txn_broker.producers.channels_of("hpg")) == 1, 5.0, "first producer gone")
        assert txn_broker.store is not None
        await wait_until(lambda: txn_broker.store.get_max_offset("ho", 0) == 1, 10.0,  # type: ignore[union-attr]
                         "committed by the second producer's check")
        assert second_listener.checked and second_listener.checked[0].body == b"orphan"
    finally:
        await second.shutdown()


async def test_producer_sigkilled_between_send_and_commit_is_checked_on_another(txn_broker: Broker,
                                                                               client_api: ClientAPI) -> None:
    await client_api.create_topic(txn_broker.address, "kp", queue_nums=1)
    survivor_listener = Listener(check=COMMIT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.client.txn_producer_process", txn_broker.address, "kpg", "kp", "from-the-dead",
        stdout=asyncio.subprocess.PIPE, cwd=os.getcwd())
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 20)).strip() == b"HALF-SENT"
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)
        async with TransactionProducer("kpg", txn_broker.address, survivor_listener):
            assert txn_broker.store is not None
            await wait_until(lambda: txn_broker.store.get_max_offset("kp", 0) == 1, 10.0,  # type: ignore[union-attr]
                             "committed by the surviving producer's check")
        assert [m.body for m in survivor_listener.checked][:1] == [b"from-the-dead"]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_listener_slower_than_the_check_interval(txn_broker: Broker, client_api: ClientAPI) -> None:
    """execute takes longer than timeout + several check intervals; checks meanwhile say UNKNOW and
    run one at a time; the commit at the end delivers once."""
    await client_api.create_topic(txn_broker.address, "slow", queue_nums=1)
    release = threading.Event()
    running_checks = [0, 0]     # now, most at once

    class Slow(Listener):
        def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
            release.wait(10)
            return COMMIT

        def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
            running_checks[0] += 1
            running_checks[1] = max(running_checks[1], running_checks[0])
            self.checked.append(message_ext)
            release.wait(0.3)           # slower than the 100 ms check interval
            running_checks[0] -= 1
            return UNKNOW

    listener = Slow()
    async with TransactionProducer("spg", txn_broker.address, listener) as producer:
        send = asyncio.create_task(producer.send_message_in_transaction(Message("slow", b"s")))
        await wait_until(lambda: len(listener.checked) >= 2, 10.0, "checked back while executing")
        release.set()
        result = await send
        assert result.local_transaction_state is COMMIT
    assert running_checks[1] == 1, "one check of a transaction at a time"
    assert txn_broker.store is not None and txn_broker.store.get_max_offset("slow", 0) == 1


async def test_check_max_reached_drops_and_counts(txn_broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(txn_broker.address, "dr", queue_nums=1)
    listener = Listener(execute=UNKNOW, check=UNKNOW)
    async with TransactionProducer("dpg", txn_broker.address, listener) as producer:
        await producer.send_message_in_transaction(Message("dr", b"never"))
        check_service = txn_broker.transaction_check
        assert check_service is not None
        await wait_until(lambda: check_service.dropped == 1, 15.0, "dropped after transaction_check_max checks")
    assert len(listener.checked) == 5
    assert txn_broker.store is not None and txn_broker.store.get_max_offset("dr", 0) == 0
    assert txn_broker.store.get_max_offset("TRANS_CHECK_MAX_TIME_TOPIC", 0) == 1
    rendered = (await txn_broker.metrics.render()).decode()
    assert 'rocketq_transaction_dropped_total{cluster="DefaultCluster",node_id="broker-a"} 1.0' in rendered


async def test_graceful_stop_waits_for_the_transaction_in_flight(txn_broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(txn_broker.address, "gs", queue_nums=1)
    gate = asyncio.Event()

    class Gated(Listener):
        async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:  # type: ignore[override]
            await gate.wait()
            return COMMIT

    producer = TransactionProducer("gpg", txn_broker.address, Gated())
    await producer.start()
    send = asyncio.create_task(producer.send_message_in_transaction(Message("gs", b"g")))
    assert txn_broker.transactions is not None
    await wait_until(lambda: txn_broker.transactions.table.pending_count == 1, 5.0)  # type: ignore[union-attr]
    stop = asyncio.create_task(producer.shutdown())
    await asyncio.sleep(0)
    with pytest.raises(Exception, match="shutting down"):
        await producer.send_message_in_transaction(Message("gs", b"refused"))
    assert not stop.done()
    gate.set()
    result, _ = await asyncio.gather(send, stop)
    assert result.local_transaction_state is COMMIT
    assert txn_broker.store is not None and txn_broker.store.get_max_offset("gs", 0) == 1


async def test_end_transaction_refusals_change_nothing(txn_broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(txn_broker.address, "rf", queue_nums=1)
    async with TransactionProducer("rpg", txn_broker.address, Listener()) as producer:
        result = await producer.send_message_in_transaction(Message("rf", b"once"))
    assert txn_broker.store is not None and txn_broker.store.get_max_offset("rf", 0) == 1
    good = EndTransactionRequestHeader(producer_group="rpg", topic="rf", tran_state_table_offset=result.queue_offset,
                                       commit_log_offset=parse_msg_id(result.msg_id)[1], commit_or_rollback=8)
    with pytest.raises(SystemError_, match="already committed"):
        await client_api.end_transaction(txn_broker.address, good)
    unknown = EndTransactionRequestHeader(producer_group="rpg", topic="rf", tran_state_table_offset=10_000,
                                          commit_log_offset=0, commit_or_rollback=8)
    with pytest.raises(SystemError_, match="no half message"):
        await client_api.end_transaction(txn_broker.address, unknown)
    remoting = client_api.remoting
    fields = good.to_fields()
    for bad, code in (({**fields, "commit_log_offset": (1 << 64) - 1}, None),
                      ({**fields, "tran_state_table_offset": -1}, None),
                      ({**fields, "commit_or_rollback": 5}, ResponseCode.SYSTEM_ERROR)):
        response = await remoting.invoke(txn_broker.address, request(RequestCode.END_TRANSACTION, bad), 3_000)
        assert response.code != ResponseCode.SUCCESS, bad
        if code is not None:
            assert response.code == code
    response = await remoting.invoke(txn_broker.address,
                                     request(RequestCode.END_TRANSACTION, fields, b"x" * 1_000_000), 3_000)
    assert response.code == ResponseCode.MESSAGE_ILLEGAL and "no body" in (response.remark or "")
    assert txn_broker.store.get_max_offset("rf", 0) == 1, "no refusal delivered anything"
