"""`start_transactions`: the transaction bridge (its table rebuilt from the store) and its started
check service, for the composition root."""

from __future__ import annotations

from collections.abc import Callable

from broker.registry.producer_manager import ProducerManager
from broker.store.message_store import MessageStore
from broker.topics.topic_config_manager import TopicConfigManager
from broker.transaction.bridge import MessagesIn, TransactionBridge
from broker.transaction.check_service import TransactionCheckService
from broker.transaction.state import TransactionTable
from conf.broker import BrokerConfig


async def start_transactions(config: BrokerConfig, store: MessageStore, topics: TopicConfigManager,
                             producers: ProducerManager, store_host: str, now_ms: Callable[[], int],
                             on_stored: MessagesIn,
                             on_dropped: Callable[[], None]) -> tuple[TransactionBridge, TransactionCheckService]:
    """Call after the store has recovered; stop the service before the store stops."""
    bridge = TransactionBridge(store, topics, TransactionTable(), store_host, now_ms, on_stored)
    bridge.rebuild()
    service = TransactionCheckService(
        bridge, producers, broker_name=config.broker_name, store_host=store_host,
        interval_ms=config.transaction_check_interval_ms, timeout_ms=config.transaction_timeout_ms,
        check_max=config.transaction_check_max, now_ms=now_ms, on_dropped=on_dropped)
    await service.start()
    return bridge, service
