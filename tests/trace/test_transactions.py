"""Transactional messages in the trace, on a real broker with a real TransactionProducer: a commit
shows the half sent, the commit, the message stored in its real topic, delivered and consumed; a
rollback shows the rollback and nothing delivered; an UNKNOW shows the check-backs before the
commit; a half never decided shows its check-backs and that it was dropped; concurrent transactions
(their halves sent as one batch, their ends as one END_TRANSACTION_BATCH) each show their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.broker import Broker
from broker.trace.segments import read_records
from client import LocalTransactionState, Message, MessageExt, TransactionProducer
from client.admin_api import AdminAPI
from protocol.topics import TRANS_HALF_TOPIC
from protocol.trace import COMMITTED_RUN, HALF, HALF_BATCH, TRANSACTION
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.conftest import broker_config
from tests.trace.helpers import Timeline, events, trace_until
from tests.trace.test_timeline import OK, consumer

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
CHECK_MAX = 3


class Listener:
    """Local transactions answer their `arg` (a state) or `execute`; check-backs answer `check`."""

    def __init__(self, execute: LocalTransactionState, check: LocalTransactionState = UNKNOW) -> None:
        self.execute, self.check = execute, check

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return arg if isinstance(arg, LocalTransactionState) else self.execute

    def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        return self.check


def _has(event: str) -> Callable[[Timeline], bool]:
    return lambda timeline: event in events(timeline)


@pytest.fixture
async def txn_broker(tmp_path: Path, admin_api: AdminAPI) -> AsyncIterator[Broker]:
    """A broker that checks back fast, with topic "payments" (one queue)."""
    config = broker_config(tmp_path, transaction_timeout_ms=300, transaction_check_interval_ms=100,
                           transaction_check_max=CHECK_MAX)
    async with Broker(config) as running:
        await admin_api.create_topic(running.address, "payments", queue_nums=1)
        yield running


async def _send(broker: Broker, listener: Listener, body: bytes, keys: str) -> tuple[str, str]:
    """(transaction id: the UNIQ_KEY, the half's offset msg id) of one transactional message."""
    async with TransactionProducer("tx-producers", broker.address, listener) as producer:
        message = Message("payments", body)
        message.keys = keys
        result = await producer.send_message_in_transaction(message)
        return result.transaction_id, result.msg_id


async def test_a_committed_message_shows_its_half_the_commit_and_its_delivery(
        txn_broker: Broker, admin_api: AdminAPI) -> None:
    address = txn_broker.address
    async with consumer(address, "ledger", "payments", lambda msgs, ctx: OK):
        uniq, half_id = await _send(txn_broker, Listener(COMMIT), b"pay 10", "payment-1")
        timeline = await trace_until(admin_api, address, lambda t: "consumed" in events(t), msg_id=uniq)
    assert events(timeline) == ["sent_half", "committed", "stored", "delivered", "consumed"]
    half, committed, stored = timeline[:3]
    assert half["msg_id"] == half_id and half["group"] == "tx-producers" and half["topic"] == "payments"
    assert TRANS_HALF_TOPIC in half["detail"] and half["uniq_key"] == uniq
    assert stored["topic"] == "payments" and stored["queue_offset"] == 0 and stored["msg_id"] != half_id
    assert committed["detail"] == "committed: written to payments:0@0"
    assert half["at_us"] <= committed["at_us"] <= stored["at_us"]
    printed = await rocketq_json("admin", "message", "trace", "--msg-id", uniq, "-n", address)
    assert [e["event"] for e in printed] == ["sent_half", "committed", "stored", "delivered", "consumed"]
    for found in (await rocketq_json("admin", "message", "trace", "--msg-id", half_id, "-n", address),
                  await rocketq_json("admin", "message", "trace", "--key", "payment-1", "-n", address)):
        assert [e["event"] for e in found] == ["sent_half", "committed", "stored", "delivered", "consumed"]
    table = await rocketq("admin", "message", "trace", "--msg-id", uniq, "-n", address)
    assert table.exit_code == 0 and "sent_half" in table.output and "committed" in table.output


async def test_a_rolled_back_message_shows_the_rollback_and_no_delivery(
        txn_broker: Broker, admin_api: AdminAPI) -> None:
    address = txn_broker.address
    async with consumer(address, "ledger", "payments", lambda msgs, ctx: OK):
        uniq, _ = await _send(txn_broker, Listener(ROLLBACK), b"pay 20", "payment-2")
        committed_uniq, _ = await _send(txn_broker, Listener(COMMIT), b"pay 21", "payment-3")
        # the consumer reads past where the rolled back message would have been
        await trace_until(admin_api, address, lambda t: "consumed" in events(t), msg_id=committed_uniq)
    timeline = await trace_until(admin_api, address, lambda t: "rolled_back" in events(t), msg_id=uniq)
    assert events(timeline) == ["sent_half", "rolled_back"]
    assert timeline[1]["detail"] == "rolled back: never delivered"


async def test_check_backs_show_before_the_commit_and_a_half_never_decided_is_dropped(
        txn_broker: Broker, admin_api: AdminAPI) -> None:
    address = txn_broker.address
    async with TransactionProducer("tx-producers", address, Listener(UNKNOW, check=COMMIT)) as producer:
        checked = (await producer.send_message_in_transaction(Message("payments", b"pay 30"))).transaction_id
        timeline = await trace_until(admin_api, address, lambda t: "stored" in events(t), msg_id=checked)
    assert events(timeline)[:2] == ["sent_half", "checked_back"] and events(timeline)[-2:] == ["committed", "stored"]
    assert timeline[1]["detail"].startswith("check-back 1:")

    async with TransactionProducer("tx-undecided", address, Listener(UNKNOW, check=UNKNOW)) as producer:
        undecided = (await producer.send_message_in_transaction(Message("payments", b"pay 40"))).transaction_id
        timeline = await trace_until(admin_api, address, lambda t: "half_dropped" in events(t), msg_id=undecided)
    assert events(timeline) == ["sent_half", *["checked_back"] * CHECK_MAX, "half_dropped"]
    assert timeline[-1]["detail"].startswith(f"dropped after {CHECK_MAX} check-backs")


async def test_concurrent_transactions_batched_each_show_their_own_outcome(
        txn_broker: Broker, admin_api: AdminAPI) -> None:
    address = txn_broker.address
    states = [COMMIT if i % 2 else ROLLBACK for i in range(8)]
    async with TransactionProducer("tx-batched", address, Listener(COMMIT)) as producer:
        results = await asyncio.gather(*(producer.send_message_in_transaction(Message("payments", b"b-%d" % i), state)
                                         for i, state in enumerate(states)))
    for result, state in zip(results, states, strict=True):
        expected = ["sent_half", "committed", "stored"] if state is COMMIT else ["sent_half", "rolled_back"]
        timeline = await trace_until(admin_api, address, _has(expected[-1]),
                                     msg_id=result.transaction_id)
        assert events(timeline) == expected, result.transaction_id
        assert timeline[0]["msg_id"] == result.msg_id


async def test_a_batch_of_halves_and_its_commits_are_one_record_each(txn_broker: Broker) -> None:
    """The halves of one SEND_BATCH_MESSAGE are one HALF_BATCH record and their commits by one
    END_TRANSACTION_BATCH one COMMITTED_RUN record (not a record per message: those were ~25 % of
    the broker's CPU in transactional sends); each half still finds its own place in them. A half
    or an end that no other joined in its loop step goes alone (SEND_MESSAGE, END_TRANSACTION) and
    is recorded alone (HALF, TRANSACTION): how the 16 split depends on timing (CI's pure-Python run
    once committed 15 in a run and the last alone), so the test asks for fewer records than messages."""
    trace = txn_broker.trace
    assert trace is not None
    async with TransactionProducer("tx-batched", txn_broker.address, Listener(COMMIT)) as producer:
        results = await asyncio.gather(*(producer.send_message_in_transaction(Message("payments", b"r-%d" % i))
                                         for i in range(16)))
    half_offsets = {result.queue_offset for result in results}      # the producer's close waited for the ends
    await trace.flush()
    records = [r for view in trace.segments.snapshot() for r in read_records(view.path, view.size)]
    halves, runs = [r for r in records if r[0] == HALF_BATCH], [r for r in records if r[0] == COMMITTED_RUN]
    lone_halves, lone_ends = [r for r in records if r[0] == HALF], [r for r in records if r[0] == TRANSACTION]
    assert {o for r in halves for o in range(r[4], r[5])} | {r[6] for r in lone_halves} == half_offsets
    assert len(halves) + len(lone_halves) < 16 and halves
    assert all(r[2:4] == [TRANS_HALF_TOPIC, 0] and r[6] == "tx-batched" and r[8:] == ["payments", 0] for r in halves)
    assert all(r[5] == "committed" for r in lone_ends)
    assert {o for r in runs for o in r[4]} | {r[4] for r in lone_ends} == half_offsets
    assert len(runs) + len(lone_ends) < 16 and runs
    written = [r[7] + i for r in runs for i in range(len(r[4]))] + [r[6][2] for r in lone_ends]
    assert sorted(written) == list(range(16))                                      # payments:0@0..15
