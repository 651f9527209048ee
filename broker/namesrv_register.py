"""`NamesrvRegistration`: the broker's side of the name servers (RocketMQ `BrokerOuterAPI`,
REFERENCE.md §15). Registers with every name server of `namesrv_addr` at start, every
`register_name_server_period_ms` after, and at once when a topic is created, changed or deleted
(`wakeup`); unregisters at a clean stop. A name server that does not answer is tried again every
second until it does (a warning when it goes down, an info line when it is back), so brokers and
name servers can start in any order; the broker serves regardless. With `credentials` (the
broker's `auth.inner_credentials`) every request is signed, as a name server with authentication
on requires; with `ssl_context` (the broker's `[tls]` on) every connection to a name server is TLS."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Sequence

from protocol.bodies import RegisterBrokerBody, TopicConfigData, TopicRouteData, decode_body, encode_body
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import MQError, error_for
from protocol.headers import GetRouteInfoRequestHeader, RegisterBrokerRequestHeader, RegisterBrokerResponseHeader
from protocol.remoting_client import RemotingClient
from protocol.service import Service
from protocol.signing import Credentials

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_MS = 3_000
UNREGISTER_TIMEOUT_MS = 1_000
DOWN_RETRY_MS = 1_000          # a name server that did not answer is tried again this soon


class NamesrvRegistration(Service):
    name = "namesrv-registration"

    def __init__(self, namesrv_addrs: Sequence[str], header: RegisterBrokerRequestHeader,
                 topic_configs: Callable[[], list[TopicConfigData]], period_ms: int,
                 credentials: Credentials | None = None, *, ssl_context: ssl.SSLContext | None = None,
                 on_master: Callable[[str, str], None] | None = None) -> None:
        """`on_master(master_addr, ha_server_addr)` after each answered registration: what the name
        server knows of this replica set's master ("" for none), how a slave finds its master."""
        super().__init__()
        self._on_master = on_master
        self._addrs, self._header, self._topic_configs = list(namesrv_addrs), header, topic_configs
        self._period_ms = period_ms
        self._remoting = RemotingClient(connect_timeout_ms=REQUEST_TIMEOUT_MS, credentials=credentials,
                                        ssl_context=ssl_context)
        self._down: set[str] = set()
        self._after_next: list[Callable[[], None]] = []
        self.registrations = 0

    async def run(self) -> None:
        while True:
            await self.register_all()
            if not await self.wait(min(self._period_ms, DOWN_RETRY_MS) if self._down else self._period_ms):
                return

    def update_header(self, header: RegisterBrokerRequestHeader) -> None:
        """Register as `header` from now on (a role change: another broker id, an HA address),
        starting at once; the name servers drop this address's entry under its former id."""
        self._header = header
        self.wakeup()

    def after_next_registration(self, callback: Callable[[], None]) -> None:
        """Call `callback` once a registration that began after this call has ended (answered or
        failed on every name server), and start one now: e.g. tell consumers of a new topic to
        look up its route once the name servers have it. Dropped at stop."""
        self._after_next.append(callback)
        self.wakeup()

    async def register_all(self) -> None:
        """REGISTER_BROKER with every name server, in parallel, with every topic config; then the
        callbacks of `after_next_registration` given before it began."""
        callbacks, self._after_next = self._after_next, []
        body = encode_body(RegisterBrokerBody(topic_configs=self._topic_configs()))
        await asyncio.gather(*(self._register(addr, body) for addr in self._addrs))
        self.registrations += 1
        for callback in callbacks:
            callback()

    async def _register(self, addr: str, body: bytes) -> None:
        try:
            response = await self._remoting.invoke(addr, request(RequestCode.REGISTER_BROKER, self._header, body),
                                                   REQUEST_TIMEOUT_MS)
            if response.code != 0:
                raise error_for(response.code, response.remark)
            if self._on_master is not None:
                answer = RegisterBrokerResponseHeader.from_fields(response.fields)
                self._on_master(answer.master_addr, answer.ha_server_addr)
        except MQError as exc:
            if addr not in self._down:
                log.warning("cannot register with name server %s: %s (retrying every %d ms)", addr, exc,
                            min(self._period_ms, DOWN_RETRY_MS))
                self._down.add(addr)
            return
        if addr in self._down:
            log.info("registered with name server %s again", addr)
            self._down.discard(addr)

    async def topic_route(self, topic: str) -> TopicRouteData | None:
        """The topic's route as the first name server that answers knows it; None when none knows
        the topic (TOPIC_NOT_EXIST). Raises the last `MQError` when no name server answered."""
        failure: MQError | None = None
        for addr in self._addrs:
            try:
                response = await self._remoting.invoke(
                    addr, request(RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic=topic)),
                    REQUEST_TIMEOUT_MS)
            except MQError as exc:
                failure = exc
                continue
            if response.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            if response.code != ResponseCode.SUCCESS:
                failure = error_for(response.code, response.remark)
                continue
            return decode_body(TopicRouteData, response.body_bytes())
        raise failure if failure is not None else MQError("no name server to ask")

    async def stop(self) -> None:
        """Stop re-registering, UNREGISTER_BROKER from every name server (bounded), close."""
        await super().stop()

        async def unregister(addr: str) -> None:
            try:
                await self._remoting.invoke(addr, request(RequestCode.UNREGISTER_BROKER, self._header),
                                            UNREGISTER_TIMEOUT_MS)
            except MQError as exc:
                log.info("could not unregister from name server %s: %s", addr, exc)
        await asyncio.gather(*(unregister(addr) for addr in self._addrs))
        await self._remoting.close()
