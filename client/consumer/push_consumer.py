"""`PushConsumer` (RocketMQ `DefaultMQPushConsumer`): subscribe, register a listener, and the
consumer pulls its share of the queues and calls the listener, committing offsets as messages are
consumed (at-least-once).

    consumer = PushConsumer("group", "127.0.0.1:10911")
    consumer.subscribe("orders", "TagA || TagB")
    consumer.register_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    async with consumer:
        ...
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from client.consumer.admin_hooks import reset_queues, running_info
from client.consumer.allocate import AllocateMessageQueueStrategy
from client.consumer.consume_concurrently import ConcurrentConsumeService
from client.consumer.consume_orderly import OrderlyConsumeService
from client.consumer.group_member import GroupMember
from client.consumer.listener import MessageListener, OrderlyMessageListener
from client.consumer.message_selector import MessageSelector
from client.consumer.offset_store import DEFAULT_OFFSET_DIR, LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore
from client.consumer.process_queue import ProcessQueue
from client.consumer.pull_nodes import PullFromWhichNode
from client.consumer.pull_service import PullService, TopicSubscription, now_ms
from client.consumer.queue_locker import LockRenewalService, QueueLocker
from client.consumer.rebalance import Rebalancer, parse_consume_timestamp
from client.consumer.send_back import SendBack
from client.errors import ClientStateError
from client.instance import ClientInstance, build_client_id, get_instance
from conf.client import ClientConfig, PushConsumerOptions, with_tls
from protocol.bodies import ConsumerRunningInfo
from protocol.errors import MQError, NoPermission
from protocol.lifecycle import Lifecycle
from protocol.model import ConsumeFromWhere, ConsumeType, MessageModel, MessageQueue
from protocol.service import PeriodicService
from protocol.signing import Credentials
from protocol.topics import check_group, retry_topic

log = logging.getLogger(__name__)


class PushConsumer(GroupMember, Lifecycle):
    """Options are RocketMQ's push-consumer settings in snake_case with the same defaults
    (`conf.client.PushConsumerOptions`); an unknown option raises `TypeError` naming the valid
    ones, an out-of-range value `ValueError`. `credentials=Credentials(access_key, secret_key)` signs
    every request (see `start` for a refusal).
    `tls=True` connects over TLS, verifying servers with the system's CAs; `ssl_context=`
    (`conf.tls.client_context(ca_file=..., cert_file=..., key_file=...)`) with a CA of your own or a
    client certificate (mutual TLS)."""

    consume_type = ConsumeType.PUSH

    def __init__(self, consumer_group: str, endpoints: str | Sequence[str],
                 message_model: str | MessageModel = "CLUSTERING",
                 consume_from_where: str | ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
                 allocate_strategy: AllocateMessageQueueStrategy | None = None, *,
                 client_config: ClientConfig | None = None, credentials: Credentials | None = None,
                 tls: bool = False, ssl_context: ssl.SSLContext | None = None, **options: Any) -> None:
        remark = check_group(consumer_group)
        if remark is not None:
            raise ValueError(remark)
        valid = {f.name for f in fields(PushConsumerOptions)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise TypeError(f"unknown PushConsumer option(s) {unknown}; valid: {sorted(valid)}")
        self._init_member(consumer_group, endpoints, message_model, consume_from_where, allocate_strategy)
        self.options = PushConsumerOptions(**options)
        self.client_config = with_tls(client_config, tls, ssl_context)
        self.credentials = credentials
        self._listener: MessageListener | OrderlyMessageListener | None = None
        self._orderly = False
        self._lock_renewal: LockRenewalService | None = None
        self._instance: ClientInstance | None = None
        self._rebalancer: Rebalancer | None = None
        self._pulls: PullService | None = None
        self._consume: ConcurrentConsumeService | OrderlyConsumeService | None = None
        self._offsets: OffsetStore | None = None
        self._send_back: SendBack | None = None
        self._expiry: PeriodicService | None = None
        self._paused = False

    # -- configuration ----------------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        """Subscribe to `topic` with a TAG expression ("*", "A", "A || B") or a `MessageSelector`
        (`MessageSelector.by_sql("amount > 100")`); raises `ValueError` for a bad topic name or an
        expression with no tag ("||"). An SQL92 expression is checked by the broker at `start()`.
        A CLUSTERING consumer also subscribes to `%RETRY%<group>` ("*") at start, where its failed
        messages come back."""
        subscription = TopicSubscription.of(topic, expression)
        self._subscriptions[topic] = subscription

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.pop(topic, None)

    def register_listener(self, listener: MessageListener | OrderlyMessageListener, orderly: bool = False) -> None:
        """`listener(msgs, context)` returns CONSUME_SUCCESS or RECONSUME_LATER; it may be sync (run
        in a thread pool of `consume_thread_max` threads) or async (awaited on the loop).

        RECONSUME_LATER, `None` or an exception fails the messages after `context.ack_index` (all
        of them unless the listener set it): in CLUSTERING they are sent back to the broker and come
        back after the delay of level `context.delay_level_when_next_consume` (0: 3 +
        reconsume_times, i.e. 10 s, 30 s, 1 min, ... with the default levels), with the original
        topic and `reconsume_times` + 1; after `max_reconsume_times` (-1: 16) failures a message goes
        to `%DLQ%<group>`. BROADCASTING drops failed messages (logged), as RocketMQ.

        `orderly=True`: the messages of each queue reach the listener in queue-offset order, one call
        at a time, and (CLUSTERING) only while this consumer holds the queue's broker lock; the
        listener gets a `ConsumeOrderlyContext` and returns `ConsumeOrderlyStatus.SUCCESS` or
        `SUSPEND_CURRENT_QUEUE_A_MOMENT` (retry the same messages after
        `context.suspend_current_queue_time_ms`, default the `suspend_current_queue_time_ms` option);
        see `client.consumer.consume_orderly`. Producers keep a key's messages in one queue with
        `SelectMessageQueueByHash`."""
        self._listener = listener
        self._orderly = orderly

    def suspend(self) -> None:
        """Stop pulling (consumption of what is cached goes on) until `resume()`."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    # -- what the instance asks ---------------------------------------------------------------------

    async def do_rebalance(self) -> None:
        """One rebalance (serialised: the periodic service, a notify and start may ask at once)."""
        async with self._rebalance_lock:
            if self._rebalancer is not None and await self._rebalancer.do_rebalance() and self._instance:
                await self._instance.send_heartbeat_to_all_brokers()

    def running_info(self, client_id: str) -> ConsumerRunningInfo:
        """GET_CONSUMER_RUNNING_INFO: subscriptions, options and the process-queue table."""
        queues = self._rebalancer.process_queues if self._rebalancer is not None else {}
        properties = {f.name: getattr(self.options, f.name) for f in fields(self.options)}
        properties |= {"consume_from_where": self.consume_from_where.value,
                       "allocate_strategy": self.allocate_strategy.name}
        offset_ms = time.time_ns() // 1_000_000 - time.monotonic_ns() // 1_000_000   # PQ instants are monotonic
        return running_info(client_id, self.consumer_data(), queues, self._offsets, properties, offset_ms)

    async def reset_offset(self, new_offsets: dict[MessageQueue, int]) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: drop the named queues this consumer holds, store the new
        offsets and reload them (see `admin_hooks.reset_queues`)."""
        async with self._rebalance_lock:
            if self._rebalancer is not None and self._offsets is not None:
                await reset_queues(self._rebalancer, self._offsets, new_offsets)

    async def persist_offsets(self) -> None:
        if self._offsets is not None and self._rebalancer is not None:
            await self._offsets.persist_all(list(self._rebalancer.process_queues))

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Register with the client instance, heartbeat, rebalance; returns when pulling has begun.
        Raises `ClientStateError` without a listener or subscription, and the broker's
        `SubscriptionParseFailed` (remark: line, column, caret) when an SQL92 subscription does not
        compile, or `SystemError_` when the broker has SQL92 disabled (the consumer is then shut down).
        As RocketMQ's, it does not fail when no broker or name server can be reached: it logs a
        warning and returns, and the periodic heartbeat, route refresh and rebalance (intervals of
        `client_config`) start the pulls once one answers. With authentication on, a route query
        refused (a wrong secret, an unknown user, no permission on a topic) raises `NoPermission`
        (the consumer is then shut down) instead of retrying for ever; a refusal after start (the
        user deleted, an ACL changed) is logged at WARNING and the pulls retry every
        `pull_time_delay_when_exception_ms`, as RocketMQ's."""
        if self._instance is not None:
            return
        if self._listener is None:
            raise ClientStateError("register_listener() before start()")
        if not self._subscriptions:
            raise ClientStateError("subscribe() to at least one topic before start()")
        clustering = self.message_model is MessageModel.CLUSTERING
        if clustering:      # failed messages come back through the group's retry topic (§9)
            retry = retry_topic(self.consumer_group)
            self._subscriptions.setdefault(retry, TopicSubscription.by_tags(retry, "*"))
        client_id = build_client_id(self.client_config.instance_name, unique_default=clustering)
        instance = get_instance(client_id, self.endpoints, self.client_config, self.credentials)
        if clustering:
            self._offsets = RemoteBrokerOffsetStore(instance.api, instance.routes, instance.endpoints[0],
                                                    self.consumer_group, self.client_config.request_timeout_ms)
        else:
            self._offsets = LocalFileOffsetStore(self.options.offset_store_dir or DEFAULT_OFFSET_DIR, client_id,
                                                 self.consumer_group)
        await self._offsets.load()
        offsets = self._offsets

        def address_of(mq: MessageQueue) -> str:     # the master, a slave while it is down
            return instance.routes.subscribe_address(mq.broker_name) or instance.endpoints[0]

        self._send_back = SendBack(instance.api, address_of, self.consumer_group, self.options.max_reconsume_times,
                                   timeout_ms=5_000)
        consume_timeout_ms = int(self.options.consume_timeout_minutes * 60_000)

        options = self.options
        locker = QueueLocker(instance.api, address_of, self.consumer_group, lambda: instance.client_id, now_ms,
                             self.client_config.request_timeout_ms)
        orderly: OrderlyConsumeService | None = None
        if self._orderly:
            self._consume = orderly = OrderlyConsumeService(
                self._listener, consume_thread_max=options.consume_thread_max,  # type: ignore[arg-type]
                batch_max_size=options.consume_message_batch_max_size, message_model=self.message_model,
                update_offset=lambda mq, o: offsets.update_offset(mq, o, increase_only=False),
                consumer_group=self.consumer_group, max_reconsume_times=options.max_reconsume_times,
                suspend_current_queue_time_ms=options.suspend_current_queue_time_ms,
                lock_max_live_time_ms=options.lock_max_live_time_ms,
                max_time_consume_continuously_ms=options.max_time_consume_continuously_ms, locker=locker,
                api=instance.api, address_of=address_of, request_timeout_ms=self.client_config.request_timeout_ms,
                unlock_delay_time_ms=options.unlock_delay_time_ms)
        else:
            self._consume = ConcurrentConsumeService(
                self._listener, consume_thread_max=options.consume_thread_max,  # type: ignore[arg-type]
                batch_max_size=options.consume_message_batch_max_size,
                reconsume_later_delay_ms=options.reconsume_later_delay_ms, message_model=self.message_model,
                update_offset=lambda mq, o: offsets.update_offset(mq, o, increase_only=True),
                consumer_group=self.consumer_group, send_back=self._send_back if clustering else None,
                consume_timeout_ms=consume_timeout_ms)
        self._pulls = PullService(instance.api, address_of, self.consumer_group, self.options, self.message_model,
                                  self._offsets, self._consume, self._subscriptions.get, self._remove_queue,
                                  lambda: self._paused, orderly=self._orderly, route_failed=instance.route_failed,
                                  nodes=PullFromWhichNode(address_of, instance.routes.broker_address))
        timestamp_ms = (parse_consume_timestamp(self.options.consume_timestamp) if self.options.consume_timestamp
                        else int(time.time() * 1000) - 30 * 60 * 1000)
        self._rebalancer = Rebalancer(
            consumer_group=self.consumer_group, client_id=lambda: instance.client_id, message_model=self.message_model,
            consume_from_where=self.consume_from_where, consume_timestamp_ms=timestamp_ms,
            strategy=self.allocate_strategy, api=instance.api, routes=instance.routes,
            update_route=instance.update_route, offset_store=self._offsets, pull_service=self._pulls,
            topics=self.subscribed_topics, address_of=address_of,
            request_timeout_ms=self.client_config.request_timeout_ms, locking=orderly,
            restart_stalled=self._pulls.restart, pull_max_idle_time_ms=options.pull_max_idle_time_ms)
        instance.register_consumer(self)
        self._instance = instance
        if self.options.metrics_port > 0:
            rebalancer = self._rebalancer
            metrics = instance.serve_metrics(self.options.metrics_port)
            self._consume.observe = metrics.track_consumer(self.consumer_group, lambda: rebalancer.process_queues)
        await instance.start()
        for topic in self._subscriptions:
            try:
                await instance.update_route(topic)
            except NoPermission:
                await self.shutdown()
                raise
            except MQError as exc:
                log.warning("route of %s unavailable at start: %s", topic, exc)
        try:
            await instance.check_client_in_broker(self.consumer_group, self.consumer_data().subscription_data_set)
        except MQError:
            await self.shutdown()
            raise
        await instance.send_heartbeat_to_all_brokers()
        try:
            await self.do_rebalance()
        except MQError as exc:      # no broker reachable yet: RocketMQ's start does not fail either
            log.warning("group %s: first rebalance failed: %s; retrying every %d ms (heartbeat every %d ms)",
                        self.consumer_group, exc, self.client_config.rebalance_interval_ms,
                        self.client_config.heartbeat_interval_ms)
        if clustering and orderly is None:  # RocketMQ cleanExpireMsg (concurrent only): every consume_timeout
            self._expiry = PeriodicService("consume-timeout", consume_timeout_ms, self._clean_expired)
            await self._expiry.start()
        if orderly is not None and clustering:
            rebalancer = self._rebalancer
            self._lock_renewal = LockRenewalService(locker, lambda: rebalancer.process_queues,
                                                    options.lock_interval_ms)
            await self._lock_renewal.start()

    async def _clean_expired(self) -> None:
        if isinstance(self._consume, ConcurrentConsumeService) and self._rebalancer is not None:
            await self._consume.clean_expired_messages(self._rebalancer.process_queues)

    async def _remove_queue(self, mq: MessageQueue) -> None:
        if self._rebalancer is not None:
            await self._rebalancer.remove_queue(mq)

    async def shutdown(self) -> None:
        """Start no listener call, stop pulling, let the calls running finish within
        `await_termination_ms` (RocketMQ's `awaitTerminationMillisWhenShutdown`, 0 by default: the
        messages of calls still running are delivered again), persist the offsets (the lowest
        offset not finished of each queue), UNREGISTER_CLIENT, and release the client instance."""
        instance, self._instance = self._instance, None
        if instance is None:
            return
        if self._consume is not None:
            self._consume.close()             # no listener call starts once the stop began
        instance.unregister_consumer(self.consumer_group)
        if instance.metrics is not None:
            instance.metrics.untrack_consumer(self.consumer_group)
        if self._expiry is not None:
            await self._expiry.stop()
            self._expiry = None
        assert self._pulls is not None and self._consume is not None and self._rebalancer is not None
        if self._lock_renewal is not None:
            await self._lock_renewal.stop()
            self._lock_renewal = None
        await self._pulls.stop_all()
        await self._consume.shutdown(self.options.await_termination_ms)
        await self.persist_offsets()
        await self._rebalancer.unlock_all()        # orderly: after the offsets, so the next owner reads them
        for pq in self._rebalancer.process_queues.values():
            pq.dropped = True
        self._rebalancer.process_queues.clear()
        await instance.unregister_from_brokers(consumer_group=self.consumer_group)
        await instance.release()

    _close = shutdown

    # -- introspection ------------------------------------------------------------------------------

    @property
    def client_id(self) -> str | None:
        return self._instance.client_id if self._instance else None

    def assigned_queues(self, topic: str | None = None) -> list[MessageQueue]:
        """The queues this consumer owns now, sorted; only those of `topic` when given (a
        CLUSTERING consumer also owns queues of its `%RETRY%<group>` topic)."""
        if self._rebalancer is None:
            return []
        return sorted(mq for mq in self._rebalancer.process_queues if topic is None or mq.topic == topic)

    @property
    def flow_control_times(self) -> int:
        """How many times a pull was put off by flow control (count, size or span over its
        threshold) since start; RocketMQ's `queueFlowControlTimes` and friends, summed."""
        return self._pulls.flow_control_times if self._pulls is not None else 0

    def process_queue(self, mq: MessageQueue) -> ProcessQueue | None:
        return self._rebalancer.process_queues.get(mq) if self._rebalancer else None
