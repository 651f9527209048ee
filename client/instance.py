"""`ClientInstance`: one per `client_id` in a process (RocketMQ `MQClientInstance`).

Owns the connections (`RemotingClient`), the `ClientAPI`, the `RouteTable` and the periodic work of
its producers and consumers: heartbeats every `heartbeat_interval_ms` (30 s) and at start, route
refresh every `poll_route_interval_ms` (30 s), offset persistence every `persist_offset_interval_ms`
(5 s) and at shutdown, and rebalance every `rebalance_interval_ms` (20 s) or at once on
NOTIFY_CONSUMER_IDS_CHANGED. Everything runs on the caller's event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from client.api import ClientAPI
from client.heartbeat import Heartbeats
from client.metrics import ClientMetrics
from client.remoting.remoting_client import RemotingClient
from client.route import RouteTable
from client.route_lookup import RouteLookup
from conf.client import ClientConfig
from protocol.bodies import (
    BrokerData,
    CheckClientRequestBody,
    ConsumerData,
    HeartbeatData,
    ProducerData,
    ResetOffsetBody,
    SubscriptionData,
    TopicRouteData,
    decode_body,
    encode_body,
)
from protocol.channel import Channel
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import ConnectionClosed, MQError, RequestCodeNotSupported, RequestTimeout
from protocol.headers import ResetConsumerClientOffsetRequestHeader
from protocol.model import ExpressionType, MessageQueue
from protocol.service import PeriodicService
from protocol.signing import Credentials

log = logging.getLogger(__name__)
ROUTE_REFRESH_ON_ERROR_MIN_S = 1.0


class MemberConsumer(Protocol):
    """What the instance needs of a registered consumer."""

    consumer_group: str

    def consumer_data(self) -> ConsumerData: ...

    def subscribed_topics(self) -> list[str]: ...

    async def do_rebalance(self) -> None: ...

    async def persist_offsets(self) -> None: ...


def local_ip() -> str:
    """This host's IPv4 address as brokers see it (127.0.0.1 when there is no other)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))   # TEST-NET: a UDP connect sends nothing
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def build_client_id(instance_name: str, *, unique_default: bool) -> str:
    """`ip@instance_name`; the name "DEFAULT" becomes `pid#nanotime` when `unique_default` (RocketMQ
    does so for clustering consumers and producers, so two in one process are distinct members)."""
    if instance_name == "DEFAULT" and unique_default:
        instance_name = f"{os.getpid()}#{time.monotonic_ns()}"
    return f"{local_ip()}@{instance_name}"


def parse_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """"h1:p1;h2:p2" (or a list) → ["h1:p1", "h2:p2"]; raises `ValueError` when empty."""
    items = endpoints.replace(",", ";").split(";") if isinstance(endpoints, str) else list(endpoints)
    result = [e.strip() for e in items if e.strip()]
    if not result:
        raise ValueError("endpoints must name at least one broker address host:port")
    return result


_INSTANCES: dict[tuple[int, str, Credentials | None], ClientInstance] = {}


def get_instance(client_id: str, endpoints: Sequence[str], config: ClientConfig,
                 credentials: Credentials | None = None) -> ClientInstance:
    """The process's instance for `client_id` and `credentials` on the running loop, created on
    first use (RocketMQ's `MQClientManager`; the issue's contract is one instance per client id in
    a process). Clients with other credentials (or none) never share an instance, so every request
    is signed as its own client asked, even under one `instance_name`. Raises `ValueError` when the
    instance exists with other TLS settings (its connections are shared)."""
    key = (id(asyncio.get_running_loop()), client_id, credentials)
    instance = _INSTANCES.get(key)
    if instance is None or instance.closed:
        instance = _INSTANCES[key] = ClientInstance(client_id, endpoints, config, credentials)
    else:
        if (instance.config.tls, instance.config.ssl_context) != (config.tls, config.ssl_context):
            raise ValueError(f"client id {client_id!r} is in use with other TLS settings (tls, ssl_context): "
                             "give this client another instance_name")
        instance.add_endpoints(endpoints)
    return instance


class ClientInstance:
    """`credentials`: every request of the instance is signed with them (`protocol.signing`)."""

    def __init__(self, client_id: str, endpoints: Sequence[str], config: ClientConfig,
                 credentials: Credentials | None = None) -> None:
        self.client_id = client_id
        self.config = config
        self.endpoints: list[str] = list(endpoints)
        self.credentials = credentials
        self.remoting = RemotingClient(connect_timeout_ms=config.connect_timeout_ms, credentials=credentials,
                                       ssl_context=config.connection_ssl_context())
        self.api = ClientAPI(self.remoting)
        self.routes = RouteTable()
        self.consumers: dict[str, MemberConsumer] = {}
        self.name_servers: set[str] = set()       # endpoints found not to be brokers (see `update_route`)
        self._route_refreshed_at: dict[str, float] = {}
        self._notified_groups: set[str] = set()   # groups a broker told to rebalance (NOTIFY_CONSUMER_IDS_CHANGED)
        self.producer_groups: set[str] = set()
        self.closed = False
        self._started = False
        self._users = 0
        self._services = [
            PeriodicService("heartbeat", config.heartbeat_interval_ms, self.send_heartbeat_to_all_brokers),
            PeriodicService("route-refresh", config.poll_route_interval_ms, self.refresh_routes),
            PeriodicService("persist-offsets", config.persist_offset_interval_ms, self.persist_all_offsets),
        ]
        self._rebalance = PeriodicService("rebalance", config.rebalance_interval_ms, self.do_rebalance)
        self.heartbeats = Heartbeats(self.api, client_id, self.heartbeat_data, self.broker_addresses,
                                     self.name_servers, config.request_timeout_ms)
        self.route_lookup = RouteLookup(self.api, self.endpoints, self.routes, self.name_servers, self.heartbeats,
                                        self._subscribers, config.request_timeout_ms)
        self.remoting.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_ids_changed)
        self.remoting.register_handler(RequestCode.GET_CONSUMER_RUNNING_INFO, self._on_running_info)
        self.remoting.register_handler(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, self._on_reset_offset)
        self.transaction_checkers: dict[str, Callable[[Channel, RemotingCommand], None]] = {}  # by producer group
        self.remoting.register_handler(RequestCode.CHECK_TRANSACTION_STATE, self._on_check_transaction)
        self.remoting.on_reconnect = self._on_reconnect
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._metrics: ClientMetrics | None = None

    @property
    def metrics(self) -> ClientMetrics | None:
        return self._metrics

    def serve_metrics(self, port: int) -> ClientMetrics:
        """This client's metrics (one registry per client instance), served on
        `config.metrics_host`:`port` from the first call on. Raises `OSError` when the port is taken."""
        if self._metrics is None:
            self._metrics = ClientMetrics(self.client_id)
        self._metrics.serve(self.config.metrics_host, port)
        return self._metrics

    def add_endpoints(self, endpoints: Sequence[str]) -> None:
        for endpoint in endpoints:
            if endpoint not in self.endpoints:
                self.endpoints.append(endpoint)

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the periodic services (once, however many producers/consumers share it)."""
        self._users += 1
        if self._started:
            return
        self._started = True
        for service in self._services:
            await service.start()
        await self._rebalance.start()

    async def release(self) -> None:
        """A producer or consumer is done with the instance; the last one shuts it down."""
        self._users -= 1
        if self._users > 0:
            return
        await self._rebalance.stop()
        for service in reversed(self._services):
            await service.stop()
        self.closed = True
        for task in list(self._side_tasks):
            task.cancel()
        await self.remoting.close()
        if self._metrics is not None:
            self._metrics.close()
        for key, instance in list(_INSTANCES.items()):
            if instance is self:
                del _INSTANCES[key]

    # -- registration -------------------------------------------------------------------------------

    def register_consumer(self, consumer: MemberConsumer) -> None:
        if consumer.consumer_group in self.consumers:
            raise ValueError(f"consumer group {consumer.consumer_group!r} is already registered in client "
                             f"{self.client_id}; use another instance_name")
        self.consumers[consumer.consumer_group] = consumer

    def unregister_consumer(self, group: str) -> None:
        self.consumers.pop(group, None)

    async def unregister_from_brokers(self, *, producer_group: str | None = None,
                                      consumer_group: str | None = None) -> None:
        """UNREGISTER_CLIENT of this client for a producer or consumer group on every broker
        (`broker_addresses`), one second each; a failure is only logged (a broker drops the client
        anyway once its heartbeats stop). A producer's or consumer's shutdown, before `release`."""
        for address in self.broker_addresses():
            try:
                await self.api.unregister_client(address, self.client_id, producer_group=producer_group,
                                                 consumer_group=consumer_group, timeout_ms=1_000)
            except MQError as exc:
                log.debug("unregister from %s failed: %s", address, exc)

    # -- routes ---------------------------------------------------------------------------------------

    async def update_route(self, topic: str) -> TopicRouteData | None:
        """`topic`'s route from the endpoints, stored in `routes`; None when no broker has it; raises
        the last connection error when no endpoint answers (see `RouteLookup.update_route`)."""
        return await self.route_lookup.update_route(topic)

    def _subscribers(self, topic: str) -> list[str]:
        return sorted(c.consumer_group for c in list(self.consumers.values()) if topic in c.subscribed_topics())

    def broker_addresses(self) -> list[str]:
        """Every broker to heartbeat, check subscriptions with and unregister from: the endpoints
        that are not name servers and every broker of every known route."""
        return sorted((set(self.endpoints) - self.name_servers) | self.routes.broker_addresses())

    def route_failed(self, topic: str) -> None:
        """A send or pull on `topic` failed: fetch its route again now (at most once a second per
        topic, in the background), so a broker that left is dropped without waiting for the poll."""
        now = time.monotonic()
        if now - self._route_refreshed_at.get(topic, 0.0) < ROUTE_REFRESH_ON_ERROR_MIN_S or self.closed:
            return
        self._route_refreshed_at[topic] = now

        async def refresh() -> None:
            try:
                await self.update_route(topic)
            except MQError as exc:
                log.info("route refresh of %s after an error failed: %s", topic, exc)
        task = asyncio.get_running_loop().create_task(refresh())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def cluster_brokers(self) -> list[BrokerData]:
        """Every broker the endpoints know, learned for heartbeats (see `RouteLookup.cluster_brokers`)."""
        return await self.route_lookup.cluster_brokers()

    async def refresh_routes(self) -> None:
        topics = set(self.routes.topics())
        for consumer in list(self.consumers.values()):
            topics.update(consumer.subscribed_topics())
        for topic in topics:
            try:
                await self.update_route(topic)
            except MQError as exc:
                log.info("route refresh of %s failed: %s", topic, exc)

    # -- heartbeat, offsets, rebalance ------------------------------------------------------------------

    def heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(client_id=self.client_id,
                             producer_data_set=[ProducerData(group_name=g) for g in sorted(self.producer_groups)],
                             consumer_data_set=[c.consumer_data() for c in self.consumers.values()])

    async def send_heartbeat_to_all_brokers(self) -> None:
        """HEART_BEAT to every broker (`broker_addresses()`); failures are logged, never raised."""
        await self.heartbeats.send_to_all()

    async def check_client_in_broker(self, consumer_group: str, subscriptions: Iterable[SubscriptionData]) -> None:
        """CHECK_CLIENT_CONFIG of every SQL92 subscription with every known broker, before the first
        heartbeat (RocketMQ `MQClientInstance#checkClientInBroker`); TAG subscriptions need none.
        Raises the broker's `SubscriptionParseFailed` (remark: line, column, caret) or `SystemError_`
        (SQL92 disabled). A broker that cannot be reached is skipped with a warning, as RocketMQ
        checks only the brokers it has routes to: the broker refuses the pulls of a bad expression."""
        for sub in subscriptions:
            if sub.expression_type == ExpressionType.TAG:
                continue
            body = CheckClientRequestBody(client_id=self.client_id, group=consumer_group, subscription_data=sub)
            for address in self.broker_addresses():
                try:
                    await self.api.check_client_config(address, body, self.config.request_timeout_ms)
                except RequestCodeNotSupported:
                    self.name_servers.add(address)
                except (ConnectionClosed, RequestTimeout) as exc:
                    log.warning("group %s: SQL92 subscription to %s not checked with %s, which cannot be "
                                "reached: %s", consumer_group, sub.topic, address, exc)

    async def persist_all_offsets(self) -> None:
        for consumer in list(self.consumers.values()):
            await consumer.persist_offsets()

    async def do_rebalance(self) -> None:
        notified, self._notified_groups = self._notified_groups, set()
        for consumer in list(self.consumers.values()):
            try:
                if consumer.consumer_group in notified:
                    await self._refresh_routes_of(consumer)
                await consumer.do_rebalance()
            except MQError as exc:
                log.info("rebalance of %s failed: %s", consumer.consumer_group, exc)

    async def _refresh_routes_of(self, consumer: MemberConsumer) -> None:
        """The routes of `consumer`'s topics again: a broker's notice may mean one of them was just
        created on it, and a route known from another broker would not list it until the next poll."""
        for topic in consumer.subscribed_topics():
            if not self.routes.has(topic):
                continue            # the rebalance asks for it anyway
            try:
                await self.update_route(topic)
            except MQError as exc:  # no endpoint answers: rebalance with the route known
                log.info("route of %s not refreshed: %s", topic, exc)

    def rebalance_immediately(self) -> None:
        self._rebalance.wakeup()

    def _on_reconnect(self, address: str) -> None:
        """A broker came back (restart or dropped connection): register with it again at once
        instead of at the next heartbeat, so pulls relying on the registered subscription resume."""
        if self.closed:
            return
        task = asyncio.get_running_loop().create_task(self._heartbeat_one(address))
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _heartbeat_one(self, address: str) -> None:
        await self.heartbeats.send(address, why="heartbeat after reconnect")

    def _on_running_info(self, channel: Channel, cmd: RemotingCommand) -> None:
        """GET_CONSUMER_RUNNING_INFO forwarded by a broker: answer with the group's consumer state."""
        group = str(cmd.fields.get("consumer_group"))
        consumer = self.consumers.get(group)
        running_info = getattr(consumer, "running_info", None)
        if running_info is None:
            response = cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"no consumer of group {group!r} in "
                                                                      f"client {self.client_id}")
        else:
            response = cmd.response(body=encode_body(running_info(self.client_id)))
        try:
            channel.send(response)
        except MQError as exc:
            log.info("running info for %s not sent: %s", group, exc)

    def _on_reset_offset(self, channel: Channel, cmd: RemotingCommand) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (one-way): the group's consumer drops and reloads the queues."""
        try:
            header = ResetConsumerClientOffsetRequestHeader.from_fields(cmd.fields)
            body = decode_body(ResetOffsetBody, cmd.body_bytes())
        except MQError as exc:
            log.warning("malformed offset reset from %s: %s", channel, exc)
            return
        reset = getattr(self.consumers.get(header.group), "reset_offset", None)
        if reset is None:
            log.info("offset reset of %s on %s: no push consumer of that group here", header.group, header.topic)
            return
        new_offsets = {MessageQueue(q.topic, q.broker_name, q.queue_id): q.after for q in body.offset_table}
        async def reset_logged() -> None:
            try:
                await reset(new_offsets)
            except MQError as exc:
                log.warning("offset reset of %s on %s failed: %s", header.group, header.topic, exc)

        task = asyncio.get_running_loop().create_task(reset_logged())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def _on_check_transaction(self, channel: Channel, cmd: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE (one-way): to the transaction producer of the named group."""
        checker = self.transaction_checkers.get(str(cmd.fields.get("producer_group")))
        if checker is not None:
            checker(channel, cmd)

    def _on_ids_changed(self, channel: Channel, cmd: RemotingCommand) -> None:
        group = str(cmd.fields.get("consumer_group"))
        log.debug("%s: consumers of %s changed", self.client_id, group)
        self._notified_groups.add(group)     # its next rebalance asks for its topics' routes first
        self.rebalance_immediately()
