"""`NameServer`: the composition root of a name server. Accepts brokers and clients on one TCP port
(the same frames as the broker), answers REGISTER_BROKER, UNREGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC,
GET_BROKER_CLUSTER_INFO and GET_ALL_TOPIC_LIST_FROM_NAMESERVER from a `RouteInfoManager`, and drops
brokers silent for `broker_channel_expired_time_ms`. Stateless: nothing is persisted; brokers
register with every name server, so several run side by side with nothing shared. The one file is
its users and ACLs (`<config_dir>/auth.json`, or `auth.store_file`), with the AUTH_* codes to
change them; with authentication on, every request is checked by an `auth.Enforcer` first
(`namesrv.auth_codes`), and with it off while listening beyond loopback, protected mode serves
loopback peers only. With `[tls]` on, the port speaks TLS (and plaintext too when permissive) and
/metrics is HTTPS only.

    async with NameServer(NamesrvConfig(listen_port=0)) as namesrv:
        ... namesrv.address ...
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from auth.admin import ADMIN_HANDLERS
from auth.enforcer import Peer
from auth.server import ServerAuth
from conf.namesrv import NamesrvConfig
from conf.tls import server_context
from namesrv.auth_codes import NAMESRV_CODE_MAP
from namesrv.protected import LoopbackOnlyProtocol
from namesrv.route_info import RouteInfoManager
from protocol.bodies import RegisterBrokerBody, TopicList, decode_body, encode_body
from protocol.channel import Channel
from protocol.channel_protocol import ChannelProtocol
from protocol.clock import Clock, SystemClock
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import ConnectionClosed, NoPermission, ResponseError, SystemError_, TopicNotExist
from protocol.headers import GetRouteInfoRequestHeader, RegisterBrokerRequestHeader, RegisterBrokerResponseHeader
from protocol.lifecycle import Lifecycle
from protocol.metrics_http import MetricsEndpoint
from protocol.service import PeriodicService
from protocol.tls_accept import TlsAcceptor
from protocol.topics import check_topic

log = logging.getLogger(__name__)
Handler = Callable[[RemotingCommand], RemotingCommand]


class NamesrvMetrics(MetricsEndpoint):
    """The name server's own registry: requests by code, live brokers, topics, expired brokers."""

    def __init__(self, routes: RouteInfoManager) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("rocketq_namesrv_requests", "Requests answered, by request and response code.",
                                ["request_code", "response_code"], registry=self.registry)
        self.expired = Counter("rocketq_namesrv_brokers_expired", "Brokers dropped for being silent.",
                               registry=self.registry)
        Gauge("rocketq_namesrv_brokers", "Live broker addresses.", registry=self.registry).set_function(
            lambda: len(routes.broker_live_table))
        Gauge("rocketq_namesrv_topics", "Topics some live broker serves.", registry=self.registry).set_function(
            lambda: len(routes.topic_queue_table))

    async def serve(self, host: str, port: int, tls: TlsAcceptor | None = None) -> int:
        """/metrics on host:port (0: a free port; HTTPS only with `tls`); returns the port."""
        async def render() -> bytes:
            return generate_latest(self.registry)     # a few gauges: cheap enough for the loop
        return await self.serve_metrics(render, host, port, tls)


class NameServer(Lifecycle):
    def __init__(self, config: NamesrvConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.routes = RouteInfoManager()
        self.metrics = NamesrvMetrics(self.routes)
        self.metrics_port: int | None = None
        self._server: asyncio.Server | None = None
        self._tls: TlsAcceptor | None = None
        self._channels: set[Channel] = set()
        self._scan = PeriodicService("scan-not-active-brokers", config.scan_not_active_broker_interval_ms,
                                     self._scan_not_active)
        self._handlers: dict[int, Handler] = {
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route_info,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._get_all_topics,
        }
        config_dir = Path(config.config_dir).expanduser()
        store_file = Path(config.auth.store_file).expanduser() if config.auth.store_file else config_dir / "auth.json"
        self.auth = ServerAuth(config.auth, store_path=store_file, base_dir=config_dir, code_map=NAMESRV_CODE_MAP,
                               clock_ms=self.clock.now_ms, server="name server", listen_host=config.listen_host,
                               protected_mode=config.protected_mode)

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (raises `OSError` when the address is taken, `TlsError` when a `[tls]` file
        cannot be loaded), start the scan and the metrics."""
        self.auth.start()
        store = self.auth.store
        assert store is not None
        for code, handler in ADMIN_HANDLERS.items():     # (rare, small writes: answered inline)
            self._handlers[code] = functools.partial(handler, store)
        config, loop = self.config, asyncio.get_running_loop()
        context = server_context(config.tls)
        tls = self._tls = TlsAcceptor(config.tls.mode, context, config.tls.handshake_timeout_ms) if context else None
        remark = self.auth.protected_remark

        def accept() -> asyncio.Protocol:
            inner: ChannelProtocol
            if remark is None:
                inner = ChannelProtocol(on_request=self._on_request, on_close=self._channels.discard,
                                        on_connect=self._channels.add, max_frame_bytes=config.max_frame_bytes)
            else:
                inner = LoopbackOnlyProtocol(remark, on_request=self._on_request, on_close=self._channels.discard,
                                             on_connect=self._channels.add, max_frame_bytes=config.max_frame_bytes)
            return inner if tls is None else tls.wrap(inner)
        self._server = await loop.create_server(accept, config.listen_host, config.listen_port, reuse_address=True)
        await self._scan.start()
        if config.metrics_port > 0:
            self.metrics_port = await self.metrics.serve(config.listen_host, config.metrics_port, tls)
        log.info("name server ready on %s", self.address)

    async def stop(self) -> None:
        await self._scan.stop()
        if self._server is not None:
            self._server.close()
            if self._tls is not None:
                await self._tls.close()
            for channel in list(self._channels):
                channel.close()
            await self._server.wait_closed()
            self._server = None
        await self.metrics.close()
        self.auth.stop()

    _close = stop

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("name server is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def request_codes(self) -> frozenset[int]:
        """The request codes this name server has handlers for (the AUTH_* ones after `start`)."""
        return frozenset(self._handlers)

    @property
    def address(self) -> str:
        host = self.config.listen_host if self.config.listen_host not in ("0.0.0.0", "", "::") else "127.0.0.1"
        return f"{host}:{self.port}"

    # -- requests -------------------------------------------------------------------------------------

    def _on_request(self, channel: Channel, request: RemotingCommand) -> None:
        """Every request is answered inline: the tables are in memory and nothing waits. With
        authentication on, the enforcer checks it first (NO_PERMISSION: no handler runs); a code a
        name server does not serve is answered REQUEST_CODE_NOT_SUPPORTED unchecked, as without
        authentication (clients given a name server as their endpoint send it a HEART_BEAT, and a
        refusal there was logged as a warning by every client that started)."""
        handler = self._handlers.get(request.code)
        enforcer = self.auth.enforcer
        refusal = None
        if handler is not None and enforcer is not None and enforcer.enabled:
            peer = channel.attributes.get("auth_peer")
            if peer is None:
                peer = channel.attributes["auth_peer"] = Peer(channel.remote_address)
            try:
                enforcer.check(request, peer)
            except NoPermission as exc:
                refusal = request.response(exc.code, remark=exc.remark)
        if refusal is not None:
            response = refusal
        elif handler is None:
            response = request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                        remark=f"request code {request.code} is not supported by a name server")
        else:
            try:
                response = handler(request)
            except ResponseError as err:
                response = request.response(err.code, remark=err.remark)
            except Exception as exc:
                log.exception("request code %d from %s failed", request.code, channel)
                response = request.response(ResponseCode.SYSTEM_ERROR,
                                            remark=f"internal error: {exc.__class__.__name__}: {exc}")
        self.metrics.requests.labels(request_code=str(request.code), response_code=str(response.code)).inc()
        if request.is_oneway or channel.closed:
            return
        with contextlib.suppress(ConnectionClosed):
            channel.send(response)

    def _register_broker(self, request: RemotingCommand) -> RemotingCommand:
        header = RegisterBrokerRequestHeader.from_fields(request.fields)
        body = decode_body(RegisterBrokerBody, request.body_bytes()) if request.body_length() else RegisterBrokerBody()
        for config in body.topic_configs:
            remark = check_topic(config.topic)
            if remark is not None:
                raise SystemError_(remark)
        if self.routes.register_broker(cluster=header.cluster_name, broker_name=header.broker_name,
                                       broker_addr=header.broker_addr, broker_id=header.broker_id,
                                       topic_configs=body.topic_configs, now_ms=self.clock.monotonic_ms(),
                                       ha_server_addr=header.ha_server_addr, grpc_addr=header.grpc_addr):
            log.info("broker %s (%s, cluster %s) registered with %d topics", header.broker_name,
                     header.broker_addr, header.cluster_name, len(body.topic_configs))
        master_addr, ha_server_addr = self.routes.master_of(header.broker_name)
        return request.response(header=RegisterBrokerResponseHeader(master_addr=master_addr,
                                                                    ha_server_addr=ha_server_addr))

    def _unregister_broker(self, request: RemotingCommand) -> RemotingCommand:
        header = RegisterBrokerRequestHeader.from_fields(request.fields)
        self.routes.unregister_broker(cluster=header.cluster_name, broker_name=header.broker_name,
                                      broker_addr=header.broker_addr, broker_id=header.broker_id)
        log.info("broker %s (%s) unregistered", header.broker_name, header.broker_addr)
        return request.response()

    def _get_route_info(self, request: RemotingCommand) -> RemotingCommand:
        header = GetRouteInfoRequestHeader.from_fields(request.fields)
        route = self.routes.topic_route(header.topic)
        if route is None:
            raise TopicNotExist(header.topic)
        return request.response(body=encode_body(route))

    def _get_cluster_info(self, request: RemotingCommand) -> RemotingCommand:
        return request.response(body=encode_body(self.routes.cluster_info()))

    def _get_all_topics(self, request: RemotingCommand) -> RemotingCommand:
        return request.response(body=encode_body(TopicList(topic_list=self.routes.all_topics())))

    async def _scan_not_active(self) -> None:
        for addr in self.routes.scan_not_active_brokers(self.clock.monotonic_ms(),
                                                        self.config.broker_channel_expired_time_ms):
            self.metrics.expired.inc()
            log.warning("broker %s silent for over %d ms: removed from every route", addr,
                        self.config.broker_channel_expired_time_ms)
