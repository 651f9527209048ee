"""The commit's speed paths keep their meaning: concurrent transactions resolved in one loop step
share "d" op records, a half evicted from the bounded cache is read back, and a restart rebuilds
no pending half from the grouped op records."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import broker.transaction.bridge as bridge_module
from broker.broker import Broker
from client import LocalTransactionState, Message, MessageExt, TransactionProducer
from protocol.topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from tests.conftest import broker_config

COUNT = 120


class Commit:
    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE if int(message.body) % 3 else LocalTransactionState.ROLLBACK_MESSAGE

    async def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        raise AssertionError("no transaction is left for a check-back")


@pytest.mark.parametrize("cache_limit", [bridge_module.HALF_CACHE_LIMIT, 4])
async def test_concurrent_transactions_share_op_records_and_survive_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_limit: int) -> None:
    monkeypatch.setattr(bridge_module, "HALF_CACHE_LIMIT", cache_limit)     # 4: most commits read back
    config = broker_config(tmp_path, transaction_timeout_ms=60_000)
    async with Broker(config) as broker:
        async with TransactionProducer("pg", broker.address, Commit()) as producer:
            results = await asyncio.gather(*(producer.send_message_in_transaction(Message("orders", b"%d" % i))
                                             for i in range(COUNT)))
        assert broker.store is not None and broker.transactions is not None
        committed = sum(1 for r in results if r.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE)
        assert committed == sum(1 for i in range(COUNT) if i % 3)
        assert broker.transactions.table.pending_count == 0
        assert sum(broker.store.get_max_offset("orders", q) for q in range(8)) == committed
        assert broker.store.get_max_offset(TRANS_HALF_TOPIC, 0) == COUNT
        ops = broker.store.get_max_offset(TRANS_OP_HALF_TOPIC, 0)
        assert 1 <= ops < COUNT, f"{ops} op records for {COUNT} resolutions"
    async with Broker(config) as broker:
        assert broker.transactions is not None and broker.store is not None
        assert broker.transactions.table.pending_count == 0, "every grouped op record read back"
        assert sum(broker.store.get_max_offset("orders", q) for q in range(8)) == committed
