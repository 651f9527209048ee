"""`build_handlers`: the broker's request-code table, one processor per concern (the composition
root `Broker` calls it once its store and services are up)."""

from __future__ import annotations

from typing import Protocol

from auth.server import ServerAuth
from broker.auth.wiring import auth_handlers
from broker.filter.filter_manager import FilterManager
from broker.locks.lock_manager import LockManager
from broker.longpoll.hold_service import HoldService
from broker.metrics import BrokerMetrics
from broker.offset.consumer_offset_manager import ConsumerOffsetManager
from broker.pop.pop_service import PopService
from broker.pop.processor import PopMessageProcessor
from broker.processors.admin import AdminProcessor
from broker.processors.client_manage import ClientManageProcessor
from broker.processors.consumer_admin import ConsumerAdminProcessor
from broker.processors.consumer_manage import ConsumerManageProcessor
from broker.processors.dedup_sends import DedupSends
from broker.processors.pull_message import PullMessageProcessor
from broker.processors.query_message import QueryMessageProcessor
from broker.processors.queue_lock import QueueLockProcessor
from broker.processors.runtime_info import RuntimeInfoProcessor
from broker.processors.send_back import SendBackProcessor
from broker.processors.send_message import SendMessageProcessor
from broker.processors.topic_group_admin import TopicGroupAdminProcessor
from broker.registry.consumer_manager import ConsumerManager
from broker.registry.limits import ClientIdTable
from broker.registry.producer_manager import ProducerManager
from broker.remoting.dispatcher import Handler
from broker.store.message_store import MessageStore
from broker.timer.timer_send import TimerSends
from broker.topics.retry_topics import RetryTopics
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.system_topics import SystemTopics
from broker.topics.topic_config_manager import TopicConfigManager
from broker.trace.query import TraceQueryProcessor
from broker.trace.service import TraceService
from broker.transaction.bridge import TransactionBridge
from broker.transaction.processor import EndTransactionBatchProcessor, EndTransactionProcessor
from conf.broker import BrokerConfig
from protocol.clock import Clock
from protocol.codes import RequestCode


class BrokerParts(Protocol):
    """What the processors are built over: the managers and services of `broker.broker.Broker`
    (named here rather than imported, so this module stays below the composition root)."""

    config: BrokerConfig
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    consumers: ConsumerManager
    producers: ProducerManager
    client_ids: ClientIdTable
    filters: FilterManager
    locks: LockManager
    metrics: BrokerMetrics
    retry_topics: RetryTopics
    clock: Clock
    auth: ServerAuth
    started_at_ms: int
    trace: TraceService | None

    @property
    def address(self) -> str: ...

    def _connection_count(self) -> int: ...

    def _notify_enabled(self, group: str) -> bool: ...


def build_handlers(broker: BrokerParts, store: MessageStore, hold: HoldService,
                   transactions: TransactionBridge | None = None,
                   pop_service: PopService | None = None) -> dict[int, Handler]:
    """Request code -> handler: every processor of the broker, built over its managers and services."""
    config = broker.config
    trace = broker.trace.recorder if broker.trace is not None else None
    if transactions is not None:
        transactions.trace = trace
    system_topics = SystemTopics(cluster_name=config.cluster_name, broker_name=config.broker_name)
    send = SendMessageProcessor(store, broker.topics, broker.address, config.store.max_message_bytes,
                                broker.metrics.on_stored, broker.retry_topics, broker.metrics.on_dlq,
                                config.max_properties_bytes, transactions, timer=TimerSends(
                                    broker.clock.now_ms, config.timer_max_delay_sec * 1000),
                                dedup=DedupSends(store.dedup, broker.clock.now_ms), trace=trace)
    send_back = SendBackProcessor(store, broker.retry_topics, broker.address, broker.metrics.on_dlq,
                                  config.max_properties_bytes, trace)
    pull = PullMessageProcessor(store, broker.topics, broker.groups, broker.consumers, broker.offsets, hold,
                                config.long_polling, broker.metrics.on_pulled, filters=broker.filters,
                                filter_support_retry=config.filter_support_retry, trace=trace,
                                slave_read_enable=config.slave_read_enable)
    client = ClientManageProcessor(broker.consumers, broker.producers, broker.groups, broker.topics, broker.clock,
                                   broker._notify_enabled, broker.filters, broker.client_ids)
    consumer = ConsumerManageProcessor(broker.consumers, broker.offsets, broker.topics, store)
    admin = AdminProcessor(store, broker.topics, broker.groups, config.broker_name, config.cluster_name,
                           broker.address, system_topics)
    locks = QueueLockProcessor(broker.locks)
    topic_group = TopicGroupAdminProcessor(store, broker.topics, broker.groups, broker.offsets, config.broker_name,
                                           system_topics)
    consumer_admin = ConsumerAdminProcessor(store, broker.topics, broker.consumers, broker.offsets, config.broker_name,
                                            broker.clock.now_ms, broker.clock.monotonic_ms)
    runtime = RuntimeInfoProcessor(config, store, broker.topics, broker.groups, broker.address, broker.started_at_ms,
                                   broker.clock.now_ms, lambda: hold.held_count, broker._connection_count,
                                   lambda: (broker.metrics.put_total, broker.metrics.get_total))
    pop_handlers: dict[int, Handler] = {}
    if pop_service is not None:
        pop = PopMessageProcessor(store, broker.topics, broker.groups, pop_service, hold, config.broker_name,
                                  on_popped=broker.metrics.on_popped)
        pop_handlers = {RequestCode.POP_MESSAGE: pop.pop_message, RequestCode.ACK_MESSAGE: pop.ack_message,
                        RequestCode.BATCH_ACK_MESSAGE: pop.batch_ack_message,
                        RequestCode.CHANGE_MESSAGE_INVISIBLETIME: pop.change_invisible_time,
                        RequestCode.NOTIFICATION: pop.notification}
    return {
        **pop_handlers,
        RequestCode.GET_ALL_TOPIC_CONFIG: topic_group.get_all_topic_config,
        RequestCode.DELETE_TOPIC_IN_BROKER: topic_group.delete_topic,
        RequestCode.GET_TOPIC_STATS_INFO: topic_group.get_topic_stats_info,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: topic_group.get_all_subscription_group_config,
        RequestCode.DELETE_SUBSCRIPTIONGROUP: topic_group.delete_subscription_group,
        RequestCode.GET_CONSUMER_CONNECTION_LIST: consumer_admin.get_consumer_connection_list,
        RequestCode.GET_CONSUME_STATS: consumer_admin.get_consume_stats,
        RequestCode.GET_CONSUMER_RUNNING_INFO: consumer_admin.get_consumer_running_info,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: consumer_admin.reset_offset,
        RequestCode.GET_BROKER_RUNTIME_INFO: runtime.get_broker_runtime_info,
        RequestCode.QUERY_MESSAGE: QueryMessageProcessor(store).query_message,
        RequestCode.QUERY_MESSAGE_TRACE: TraceQueryProcessor(lambda: broker.trace, store, broker.topics,
                                                                  broker.address).query,
        RequestCode.SEND_MESSAGE: send.process,
        RequestCode.SEND_BATCH_MESSAGE: send.process_batch,
        RequestCode.PULL_MESSAGE: pull.process,
        RequestCode.CONSUMER_SEND_MSG_BACK: send_back.process,
        RequestCode.HEART_BEAT: client.heart_beat,
        RequestCode.UNREGISTER_CLIENT: client.unregister_client,
        RequestCode.CHECK_CLIENT_CONFIG: client.check_client_config,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer.get_consumer_list,
        RequestCode.QUERY_CONSUMER_OFFSET: consumer.query_consumer_offset,
        RequestCode.UPDATE_CONSUMER_OFFSET: consumer.update_consumer_offset,
        RequestCode.GET_MAX_OFFSET: admin.get_max_offset,
        RequestCode.GET_MIN_OFFSET: admin.get_min_offset,
        RequestCode.GET_EARLIEST_MSG_STORETIME: admin.get_earliest_msg_storetime,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: admin.search_offset_by_timestamp,
        RequestCode.VIEW_MESSAGE_BY_ID: admin.view_message_by_id,
        RequestCode.UPDATE_AND_CREATE_TOPIC: admin.update_and_create_topic,
        RequestCode.GET_ROUTEINFO_BY_TOPIC: admin.get_route_info,
        RequestCode.GET_BROKER_CLUSTER_INFO: admin.get_broker_cluster_info,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.update_and_create_subscription_group,
        RequestCode.LOCK_BATCH_MQ: locks.lock_batch_mq,
        RequestCode.UNLOCK_BATCH_MQ: locks.unlock_batch_mq,
        **({RequestCode.END_TRANSACTION: EndTransactionProcessor(transactions).process,
            RequestCode.END_TRANSACTION_BATCH: EndTransactionBatchProcessor(transactions).process}
           if transactions is not None else {}),
        **auth_handlers(broker.auth),
    }
