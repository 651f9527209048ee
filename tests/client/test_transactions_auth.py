"""Transactions with authentication and authorization on: a TransactionProducer with
`credentials=` commits, and answers a check-back, as a Normal user with Pub on its topic; another
user can neither commit nor roll back its half messages (NO_PERMISSION on the topic, or refused
for naming another topic), and nothing is delivered by the attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.broker import Broker
from client import LocalTransactionState, Message, MessageExt, NoPermission, TransactionProducer
from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient
from protocol.errors import SystemError_
from protocol.headers_v5 import EndTransactionRequestHeader
from protocol.message import parse_msg_id
from tests.helpers import wait_until
from tests.security_helpers import add_user, admin_api, secured_config

COMMIT, UNKNOW = LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.UNKNOW


class Decide:
    def __init__(self, execute: LocalTransactionState, check: LocalTransactionState) -> None:
        self.execute, self.check = execute, check

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return self.execute

    def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        return self.check


async def test_transactions_as_normal_users(tmp_path: Path) -> None:
    config = secured_config(tmp_path, lenient=True, transaction_timeout_ms=200, transaction_check_interval_ms=100)
    async with Broker(config) as broker:
        async with admin_api() as api:
            await api.create_topic(broker.address, "orders", queue_nums=1)
            await api.create_topic(broker.address, "other", queue_nums=1)
        app = await add_user(broker.address, "app", [("Topic:orders", ["Pub"])])
        intruder = await add_user(broker.address, "intruder", [("Topic:other", ["Pub"])])
        assert broker.store is not None and broker.transactions is not None
        async with TransactionProducer("app-pg", broker.address, Decide(COMMIT, COMMIT), credentials=app) as producer:
            committed = await producer.send_message_in_transaction(Message("orders", b"committed"))
            assert committed.local_transaction_state is COMMIT
        assert broker.store.get_max_offset("orders", 0) == 1

        remoting = RemotingClient(credentials=intruder)
        api_as_intruder = AdminAPI(remoting)
        checker = Decide(UNKNOW, COMMIT)
        try:
            async with TransactionProducer("app-pg", broker.address, Decide(UNKNOW, UNKNOW),
                                           credentials=app) as producer:
                pending = await producer.send_message_in_transaction(Message("orders", b"pending"))
                header = EndTransactionRequestHeader(
                    producer_group="app-pg", topic="orders", tran_state_table_offset=pending.queue_offset,
                    commit_log_offset=parse_msg_id(pending.msg_id)[1], commit_or_rollback=8)
                with pytest.raises(NoPermission, match="User:intruder"):
                    await api_as_intruder.end_transaction(broker.address, header)
                other_topic = EndTransactionRequestHeader(**{**header.to_fields(), "topic": "other"})
                with pytest.raises(SystemError_, match="is for topic 'orders'"):
                    await api_as_intruder.end_transaction(broker.address, other_topic)
                assert broker.store.get_max_offset("orders", 0) == 1, "the intruder delivered nothing"
                assert broker.transactions.table.pending_count == 1
                producer.listener = checker      # the check-back, answered over the signed connection
                await wait_until(lambda: broker.store.get_max_offset("orders", 0) == 2, 10.0,  # type: ignore[union-attr]
                                 "committed by the check-back")
        finally:
            await remoting.close()
        assert broker.transactions.table.pending_count == 0
