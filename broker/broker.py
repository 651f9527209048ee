"""`Broker`: the composition root. Builds the store, managers, services and processors, starts them
in dependency order and stops them in reverse (ARCHITECTURE.md "Lifecycle orders"). No domain logic.

    async with Broker(BrokerConfig(listen_port=0, store=StoreConfig(path=tmp))) as broker:
        ... broker.address ...
"""

from __future__ import annotations

import logging

from broker.address import advertised_host
from broker.arrivals import arrival_listeners, hold_matcher
from broker.auth.wiring import broker_auth
from broker.filter.filter_manager import FilterManager
from broker.filter.sql92.bounds import Sql92Limits
from broker.grpc.server import GrpcServer
from broker.ha.agent import ControllerAgent, route_id
from broker.ha.ha_metrics import HACollector
from broker.ha.wiring import Replication, start_replication
from broker.handlers import build_handlers
from broker.lag_collector import BrokerStateCollector, LagCollector
from broker.locks.lock_manager import LockManager
from broker.longpoll.hold_service import HoldService
from broker.metrics import BrokerMetrics
from broker.namesrv_register import NamesrvRegistration
from broker.offset.consumer_offset_manager import ConsumerOffsetManager
from broker.persist import ConfigPersistService
from broker.pop.pop_service import PopService, build_pop_service
from broker.registry.consumer_manager import ConsumerManager
from broker.registry.housekeeping import HousekeepingService
from broker.registry.ids_changed import IdsChangedNotifier
from broker.registry.limits import ClientIdTable
from broker.registry.producer_manager import ProducerManager
from broker.remoting.dispatcher import Dispatcher
from broker.remoting.guard import ConnectionGuard, ConnectionLimits, GuardedProtocol
from broker.remoting.server import RemotingServer
from broker.schedule.schedule_service import DelayOffsets, ScheduleService
from broker.store.lock import StoreLock
from broker.store.message_store import MessageStore
from broker.timer.timer_progress import TimerProgress
from broker.timer.timer_store import TimerMessageStore
from broker.topics.recovery import recover_topic_configs
from broker.topics.retry_topics import RetryTopics
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from broker.trace.service import TraceMetrics, TraceService
from broker.transaction.bridge import TransactionBridge
from broker.transaction.check_service import TransactionCheckService
from broker.transaction.wiring import start_transactions
from conf.broker import BrokerConfig
from conf.namesrv import parse_namesrv_addr
from conf.tls import broker_client_context, server_context
from protocol.bodies import TopicConfigData
from protocol.channel import Channel
from protocol.clock import Clock, SystemClock
from protocol.command import RemotingCommand
from protocol.headers import RegisterBrokerRequestHeader
from protocol.lifecycle import Lifecycle
from protocol.tls_accept import TlsAcceptor

log = logging.getLogger(__name__)


class Broker(Lifecycle):
    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.topics = TopicConfigManager(auto_create_topic=config.auto_create_topic,
                                         default_queue_nums=config.default_queue_nums)
        self.groups = SubscriptionGroupManager(auto_create=config.auto_create_subscription_group)
        self.offsets = ConsumerOffsetManager()
        self.ids_changed = IdsChangedNotifier(lambda group: self.consumers.channels_of(group),
                                              config.notify_consumer_ids_changed_interval_ms,
                                              config.notify_consumer_ids_changed_max_rounds)
        self.consumers = ConsumerManager(self.ids_changed.changed,
                                         max_consumers_per_group=config.max_consumers_per_group)
        self.client_ids = ClientIdTable(config.max_client_ids_per_address)
        self.topics.on_created = self._on_topic_created
        self.producers = ProducerManager()
        self.filters = FilterManager(sql92_enabled=config.filter_support_sql92, limits=Sql92Limits(
            max_expression_bytes=config.sql92_max_expression_bytes, max_depth=config.sql92_max_depth,
            max_terms=config.sql92_max_terms), cache_bytes=config.sql92_compile_cache_bytes)
        self.locks = LockManager(self.clock, config.lock_max_live_ms)
        label_sets = config.metrics_max_label_sets
        self.metrics = BrokerMetrics(config.cluster_name, config.broker_name, config.store.path,
                                     max_label_sets=label_sets)
        self.metrics.add_collector(LagCollector(self.metrics.labels, lambda: self.store, self.offsets,
                                                self.clock.now_ms, label_sets))
        self.metrics.add_collector(BrokerStateCollector(
            self.metrics.labels, topics=self.topics, groups=self.groups, consumers=self.consumers,
            producers=self.producers, connections=self._connection_count, store=lambda: self.store,
            max_label_sets=label_sets))
        self.metrics.track_names(lambda topic: self.topics.get(topic) is not None,
                                 lambda group: self.groups.get(group) is not None)
        self.retry_topics = RetryTopics(self.topics, self.groups)
        self.delay_offsets = DelayOffsets()
        self.timer_progress = TimerProgress()       # copied to slaves: see `_on_role`
        self.store: MessageStore | None = None
        self.hold_service: HoldService | None = None
        self.schedule: ScheduleService | None = None
        self.timer: TimerMessageStore | None = None
        self.pop_service: PopService | None = None
        self.trace: TraceService | None = None      # the message trace (None: `trace.enabled` off)
        self.metrics.add_collector(TraceMetrics(self.metrics.labels, lambda: self.trace))
        self.registration: NamesrvRegistration | None = None
        self.transactions: TransactionBridge | None = None
        self.transaction_check: TransactionCheckService | None = None
        self._server: RemotingServer | None = None
        self._store_lock = StoreLock(config.store.path)
        self._persist = ConfigPersistService(config.store.path / "config",
                                             [self.topics, self.groups, self.offsets, self.delay_offsets,
                                              self.timer_progress], config.persist_interval_ms)
        self._dispatcher: Dispatcher | None = None
        self._housekeeping: HousekeepingService | None = None
        self.auth = broker_auth(config, self.clock.now_ms)
        self.connection_guard = ConnectionGuard(ConnectionLimits(
            max_connections=config.max_connections, max_buffered_bytes=config.max_buffered_bytes,
            frame_read_timeout_ms=config.frame_read_timeout_ms,
            channel_expired_timeout_ms=config.channel_expired_timeout_ms,
            max_connections_per_address=config.max_connections_per_address,
            max_unsent_bytes_per_connection=config.max_unsent_bytes_per_connection,
            close_unsent_bytes_per_connection=config.close_unsent_bytes_per_connection,
            write_stall_timeout_ms=config.write_stall_timeout_ms, protected_remark=self.auth.protected_remark),
            self.clock.monotonic_ms)
        self._address: str | None = None
        self.replication: Replication | None = None
        self.controller_agent: ControllerAgent | None = None
        self.grpc: GrpcServer | None = None          # RocketMQ 5's gRPC API (`grpc_port` > 0)
        self.metrics_port: int | None = None
        self.started_at_ms = 0

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Lock the store directory, load state, recover the store, start services, then listen
        (last). Raises `StoreLocked` (an `OSError`) when another broker holds the store directory,
        before anything in it is read or written, `OSError` when the port is taken and `TlsError` (an
        `OSError`) when a `[tls]` file cannot be loaded (everything started is stopped again)."""
        config = self.config
        self.started_at_ms = self.clock.now_ms()
        try:
            self._store_lock.acquire()
            self._persist.load()
            self.auth.start()
            tls_context = server_context(config.tls)        # None: TLS disabled
            tls = TlsAcceptor(config.tls.mode, tls_context, config.tls.handshake_timeout_ms) if tls_context else None
            host = advertised_host(config.listen_host)
            # The store host (in every msg_id) needs the port; with port 0 it is known only after
            # binding, so the socket is bound first but accepts nothing before `begin_serving`.
            server = RemotingServer(config.listen_host, config.listen_port, on_request=self._on_request,
                                    on_close=self._on_channel_closed, max_frame_bytes=config.max_frame_bytes,
                                    guard=self.connection_guard,
                                    max_requests_per_step=config.max_requests_per_step, tls=tls)
            await server.start()
            self._server = server
            self._address = f"{host}:{server.port}"
            store = MessageStore(config.store, store_host=self._address, clock_ms=self.clock.now_ms)
            await store.start()
            self.store = store
            await recover_topic_configs(self.topics, store.queue_keys(), store.get_max_offset,
                                        config.default_queue_nums)
            if config.trace.enabled:
                self.trace = TraceService(config.trace, config.store.path, self.clock.now_ms)
                await self.trace.start()
                self.offsets.on_commit = self.trace.recorder.committed
                self.client_ids.on_admit = self.trace.recorder.client
            hold = HoldService(store.get_max_offset, config.long_polling.check_interval_ms,
                               hold_matcher(self.filters, store))
            self.hold_service = hold
            self.delay_offsets.flushed_offset = lambda: store.flushed_offset
            schedule = ScheduleService(store, self.delay_offsets, self.clock.now_ms)
            self.schedule = schedule
            timer = self.timer = TimerMessageStore(store, config.store.path / "timer", now_ms=self.clock.now_ms,
                                                   precision_ms=config.timer_precision_ms,
                                                   max_delay_ms=config.timer_max_delay_sec * 1000,
                                                   roll_window_ms=config.timer_roll_window_slots
                                                   * config.timer_precision_ms,
                                                   on_lateness=self.metrics.observe_timer_lateness)
            self.metrics.track_timer(timer)
            self.timer_progress.saved = lambda: timer.checkpointer.saved_mark
            store.set_arrival_listener(*arrival_listeners(self.filters, hold, schedule, timer,
                                                          config.long_polling.enable))
            delivers = not config.is_slave and not config.controller_addr   # a slave re-puts nothing (as RocketMQ's)
            if delivers:
                await schedule.start()
                await timer.start()
            self.transactions, self.transaction_check = await start_transactions(
                config, store, self.topics, self.producers, self._address, self.clock.now_ms,
                self.metrics.on_stored, self.metrics.on_transaction_dropped)
            if not delivers:
                await self.transaction_check.stop()
            self.metrics.track_transactions(lambda: self.transactions.table.pending_count if self.transactions else 0)
            await hold.start()
            self.pop_service = build_pop_service(
                store, self.retry_topics, self.clock.now_ms, cluster_name=config.cluster_name,
                config_dir=config.store.path / "config", max_in_flight=config.pop_max_in_flight_per_queue,
                revive_interval_ms=config.pop_revive_interval_ms, persist_interval_ms=config.persist_interval_ms,
                store_host=self._address, on_dlq=self.metrics.on_dlq)
            self.pop_service.trace = self.trace.recorder if self.trace is not None else None
            if delivers:
                await self.pop_service.start()
            self._housekeeping = HousekeepingService(
                self.consumers, self.producers, self.clock, config.channel_expired_timeout_ms,
                config.housekeeping_interval_ms, on_expired=self._on_channel_expired)
            await self._housekeeping.start()
            await self._persist.start()
            self.replication = await start_replication(
                config, store, [self.topics, self.groups, self.offsets, self.delay_offsets, self.timer_progress],
                enforcer=lambda: self.auth.enforcer, credentials=self.auth.inner_credentials,
                server_tls=tls_context, client_tls=broker_client_context(config.tls))
            self.metrics.track(lambda: hold.held_count, lambda: store.reput_lag_bytes)
            self.metrics.track_limits(lambda: store.disk_guard.refusal is None,
                                      lambda reason: self.connection_guard.closed[reason],
                                      lambda: self.connection_guard.buffered_bytes)
            store.set_fsync_observer(self.metrics.observe_fsync)
            self.metrics.track_schedule(len(store.delay_levels), schedule.backlog)
            self.metrics.add_collector(HACollector(self.metrics.labels, lambda: self.replication,
                                                   store.commit_log_max_offset, self._epoch))
            if config.metrics_port > 0:
                self.metrics_port = await self.metrics.serve(config.listen_host, config.metrics_port, tls)
            handlers = build_handlers(self, store, hold, self.transactions, self.pop_service)
            self.metrics.set_request_codes(handlers)
            self._dispatcher = Dispatcher(handlers, self.metrics.observe_request, config.max_in_flight_per_connection,
                                          max_in_flight_bytes_per_channel=config.max_unsent_bytes_per_connection,
                                          log=self.connection_guard.log, enforcer=self.auth.enforcer)
            self.connection_guard.count_in_flight(self._dispatcher.in_flight_bytes)
            await self.connection_guard.start()
            if config.grpc_port:
                self.grpc = GrpcServer(self, handlers, lambda: self.auth.enforcer, host=config.listen_host,
                                       port=config.grpc_port, advertised_host=host, tls=config.tls,
                                       max_message_bytes=config.store.max_message_bytes,
                                       max_concurrent_calls=config.grpc_max_concurrent_calls,
                                       delay_levels_ms=store.delay_levels)
                await self.grpc.start()
            await server.begin_serving()
            if config.namesrv_addr:
                await self._start_registration(config.namesrv_addr)
            if config.controller_addr:
                self.controller_agent = ControllerAgent(
                    config, self.replication, store, lambda: self.address, self._on_role,
                    credentials=self.auth.inner_credentials, ssl_context=broker_client_context(config.tls))
                await self.controller_agent.start()
        except BaseException:
            await self.stop()
            raise
        log.info("broker %s ready on %s%s", config.broker_name, self._address,
                 f"; metrics on http{'s' if tls else ''}://{config.listen_host}:{self.metrics_port}/metrics"
                 if self.metrics_port else "")

    async def stop(self) -> None:
        """Stop accepting, answer held pulls, let in-flight requests finish (bounded), close
        connections, persist state, flush and close the store, then release the store directory's
        lock. Safe to call more than once."""
        if self.controller_agent is not None:
            await self.controller_agent.stop()
            self.controller_agent = None
        if self.registration is not None:       # first: clients stop being routed here
            self.topics.on_change = None
            await self.registration.stop()
            self.registration = None
        if self._server is not None:
            self._server.stop_accepting()
        if self.hold_service is not None:
            self.hold_service.release_all()
        if self.pop_service is not None:
            self.pop_service.release_all()
        if self.grpc is not None:               # its held receives were just answered
            await self.grpc.stop(self.config.graceful_shutdown_timeout_ms)
            self.grpc = None
        if self._dispatcher is not None:
            await self._dispatcher.drain(self.config.graceful_shutdown_timeout_ms)
        await self.filters.close()
        if self.replication is not None:
            await self.replication.stop()
            self.replication = None
        if self._server is not None:
            await self._server.close()
            self._server = None
        self.ids_changed.close()
        await self.connection_guard.stop()
        if self.hold_service is not None:
            await self.hold_service.stop()
        for name in ("_housekeeping", "transaction_check", "timer", "schedule"):    # in this order
            service = getattr(self, name)
            if service is not None:
                await service.stop()
                setattr(self, name, None)
        if self.pop_service is not None:        # snapshots the POP state
            await self.pop_service.stop()
            self.pop_service = None
        if self.trace is not None:              # writes the events still waiting
            self.offsets.on_commit = self.client_ids.on_admit = None
            await self.trace.stop()
            self.trace = None
        if self.store is not None:      # delivery offsets are persisted only up to what is on disk
            await self.store.flush()
        await self._persist.stop()
        if self.store is not None:
            await self.store.stop()
            self.store = None
        await self.metrics.close()
        self._dispatcher = None
        self.auth.stop()
        self._store_lock.release()

    _close = stop

    @property
    def address(self) -> str:
        """"host:port" clients connect to (the advertised host and the bound port)."""
        if self._address is None:
            raise RuntimeError("broker is not started")
        return self._address

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def connection_protocol(self) -> GuardedProtocol:
        """A protocol exactly as the broker gives each accepted TCP connection (guard, dispatcher,
        channel tracking); `connection_made(transport)` opens it. For feeding the broker frames in
        process (`bench.inproc`). Raises `RuntimeError` before `start`."""
        if self._server is None:
            raise RuntimeError("the broker is not started")
        return self._server.protocol()

    @property
    def request_codes(self) -> frozenset[int]:
        """The request codes this broker has handlers for (after `start`)."""
        return self._dispatcher.request_codes if self._dispatcher is not None else frozenset()

    def _connection_count(self) -> int:
        return len(self._server.channels) if self._server is not None else 0

    # -- wiring -----------------------------------------------------------------------------------

    async def _start_registration(self, namesrv_addr: str) -> None:
        """Register with the name servers now and every `register_name_server_period_ms`, and again
        at once whenever a topic changes."""
        config, topics, replication = self.config, self.topics, self.replication
        header = self._registration_header()

        def topic_configs() -> list[TopicConfigData]:
            return [TopicConfigData(topic=t.topic, read_queue_nums=t.read_queue_nums,
                                    write_queue_nums=t.write_queue_nums, perm=t.perm) for t in topics.topics()]
        registration = NamesrvRegistration(parse_namesrv_addr(namesrv_addr), header, topic_configs,
                                           config.register_name_server_period_ms, self.auth.inner_credentials,
                                           ssl_context=broker_client_context(config.tls),
                                           on_master=replication.on_master if replication is not None else None)
        self.registration = registration
        topics.on_change = registration.wakeup
        await registration.start()

    def _registration_header(self) -> RegisterBrokerRequestHeader:
        config, replication = self.config, self.replication
        ha_addr = replication.ha_address(self.address) if replication is not None else ""
        broker_id = (route_id(config, replication.is_master) if config.controller_addr and replication is not None
                     else config.broker_id)
        grpc_addr = f"{self.address.rpartition(':')[0]}:{self.grpc.port}" if self.grpc is not None else ""
        return RegisterBrokerRequestHeader(broker_name=config.broker_name, broker_addr=self.address,
                                           cluster_name=config.cluster_name, broker_id=broker_id,
                                           ha_server_addr=ha_addr, grpc_addr=grpc_addr)

    def _epoch(self) -> int:
        return self.controller_agent.epoch if self.controller_agent is not None else 0

    async def _on_role(self, is_master: bool) -> None:
        """Controller mode: elected master, give a config to every topic it holds messages of but
        has none for (as at start-up: `recover_topic_configs`), start what only a master runs
        (delayed and timer delivery from the copied delay offsets, transaction checks, POP
        revives); stepped down, stop it. Then re-register."""
        if is_master and self.store is not None:
            await recover_topic_configs(self.topics, self.store.queue_keys(), self.store.get_max_offset,
                                        self.config.default_queue_nums)
            if self.timer is not None:      # what the old master's timer delivered is not delivered again
                self.timer.state.delivered_by_master = self.timer_progress.usable(self.store.commit_log_max_offset())
        timer = self.timer          # paused, not stopped: stopping it closes its files for good
        services = [self.schedule, *((timer.enqueue, timer.dequeue, timer.checkpointer) if timer else ()),
                    self.transaction_check, self.pop_service]
        for service in services:
            if service is not None:
                await (service.start() if is_master else service.stop())
        if self.registration is not None:
            self.registration.update_header(self._registration_header())

    def _on_request(self, channel: Channel, command: RemotingCommand) -> None:
        dispatcher = self._dispatcher
        if dispatcher is None:      # listening but not ready yet (start in progress) or stopping
            channel.close()
            return
        dispatcher.on_request(channel, command)

    def _notify_enabled(self, group: str) -> bool:
        if not self.config.notify_consumer_ids_changed_enable:
            return False
        group_config = self.groups.get(group)
        return group_config is None or group_config.notify_consumer_ids_changed_enable

    def _on_topic_created(self, topic: str) -> None:
        """Consumers subscribed to a topic before it existed rebalance at once, not at their next
        periodic rebalance; with name servers, once the registration that carries the topic is done."""
        def notify() -> None:
            self.consumers.notify_topic_created(topic, self._notify_enabled)
        if self.registration is not None:
            self.registration.after_next_registration(notify)
        else:
            notify()

    def _on_channel_closed(self, channel: Channel) -> None:
        self.consumers.remove_channel(channel, self._notify_enabled)
        self.producers.remove_channel(channel)
        self.client_ids.remove_channel(channel)

    def _on_channel_expired(self, channel: Channel) -> None:
        self._on_channel_closed(channel)
        channel.close()
