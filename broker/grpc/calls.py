"""`GrpcCalls`: what every call of the gRPC API shares: who calls (its client channel, user and
peer), and running the broker's own request handlers in process for it (RocketMQ's proxy "local
mode": a call is translated to the RemotingCommand it stands for and handed to that request code's
processor, with no connection in between). The user's ACLs are checked on that command, exactly as
a remoting request of the same code is (`auth.enforcer.Enforcer.authorize`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Protocol, TypeVar

import grpc

from auth.enforcer import Peer
from auth.model import User
from broker.grpc.auth import CLIENT_ID, GrpcAuth, metadata_value, peer_of
from broker.grpc.proto import definition_pb2 as pb
from broker.grpc.sessions import ClientChannel, Sessions
from broker.grpc.status import GrpcError, of_error, status
from broker.metrics import BrokerMetrics
from broker.namesrv_register import NamesrvRegistration
from broker.pop.pop_service import PopService
from broker.registry.consumer_manager import ConsumerManager
from broker.registry.producer_manager import ProducerManager
from broker.remoting.context import RequestContext
from broker.remoting.dispatcher import Handler, answer_of
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from conf.broker import BrokerConfig
from protocol.clock import Clock
from protocol.command import RemotingCommand, request
from protocol.errors import NoPermission, ResponseError, error_for
from protocol.headers import Header
from protocol.topics import check_group, check_topic

R = TypeVar("R")


class GrpcParts(Protocol):
    """What the gRPC API is built over: `broker.broker.Broker`'s managers (named, not imported)."""

    config: BrokerConfig
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    producers: ProducerManager
    consumers: ConsumerManager
    pop_service: PopService | None
    registration: NamesrvRegistration | None
    clock: Clock
    metrics: BrokerMetrics

    @property
    def address(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Caller:
    """One call's caller: its client (None when it sent no `x-mq-client-id`), user and peer."""

    channel: ClientChannel | None
    user: User | None
    peer: Peer
    context: RequestContext


class GrpcCalls:
    """The state the servicer's calls share. `handlers`: the broker's request code → handler
    table; `sessions`: the known clients (one dropped by it is unregistered here, `forget`);
    `endpoint()`: the (host, port) clients reach this broker's gRPC API at."""

    def __init__(self, parts: GrpcParts, handlers: Mapping[int, Handler], auth: GrpcAuth, sessions: Sessions,
                 endpoint: Callable[[], tuple[str, int]]) -> None:
        self.parts = parts
        self.handlers = handlers
        self.auth = auth
        self.sessions = sessions
        self.endpoint = endpoint

    def caller(self, context: grpc.aio.ServicerContext[Any, Any]) -> Caller:
        """Authenticate the call; raises `NoPermission` (UNAUTHORIZED)."""
        metadata = context.invocation_metadata()
        peer_text = context.peer() or ""
        peer = peer_of(peer_text)
        client_addr = peer_text.partition(":")[2] if peer_text.startswith(("ipv4:", "ipv6:")) else f"{peer.ip}:0"
        user = self.auth.user(metadata, peer, self.parts.clock.now_ms())
        client_id = metadata_value(metadata, CLIENT_ID)
        channel = None
        if client_id:
            channel, evicted = self.sessions.channel(client_id[:256], peer.ip)
            if evicted is not None:
                self.forget(evicted)
        context_channel: Any = channel if channel is not None else ClientChannel("-", peer.ip)
        return Caller(channel, user, peer, RequestContext(context_channel, client_addr))

    def forget(self, channel: ClientChannel) -> None:
        """Drop a client from the broker's registries."""
        self.parts.producers.remove_channel(channel)      # type: ignore[arg-type]
        self.parts.consumers.remove_channel(channel, lambda group: False)   # type: ignore[arg-type]

    async def guarded(self, context: grpc.aio.ServicerContext[Any, Any], response_type: Callable[..., R],
                      run: Callable[[Caller], Awaitable[R]]) -> R:
        """`run(caller)`'s response, or `response_type(status=...)` for what it raised: a failed
        authentication UNAUTHORIZED, an ACL refusal FORBIDDEN, others as `status.of_error`."""
        try:
            caller = self.caller(context)
        except NoPermission as exc:
            return response_type(status=status(pb.UNAUTHORIZED, str(exc)))
        except Exception as exc:
            return response_type(status=of_error(exc))
        try:
            return await run(caller)
        except Exception as exc:
            return response_type(status=self.error_status(exc, caller))

    @staticmethod
    def error_status(exc: BaseException, caller: Caller | None) -> pb.Status:
        """A call's failure: NO_PERMISSION is UNAUTHORIZED before the caller was known, FORBIDDEN after."""
        if isinstance(exc, NoPermission):
            if caller is None:
                return status(pb.UNAUTHORIZED, str(exc))
            return status(pb.FORBIDDEN, str(exc))
        return of_error(exc)

    async def invoke(self, caller: Caller, code: int, header: Header | Mapping[str, Any], body: bytes = b"",
                     *, raise_error: bool = True) -> RemotingCommand:
        """Run request `code`'s handler in process; returns its response, counted in the broker's
        request metrics as the remoting request would be. The user's ACLs are checked first
        (`NoPermission`). With `raise_error`, a response that is not SUCCESS raises its
        `ResponseError`."""
        command = request(code, header, body)
        self.auth.authorize(command, caller.peer, caller.user)
        handler = self.handlers.get(code)
        if handler is None:
            raise GrpcError(pb.NOT_IMPLEMENTED, f"request code {code} is not served by this broker")
        started = perf_counter()
        try:
            response = await answer_of(handler(caller.context, command))
        except ResponseError as exc:
            self.parts.metrics.observe_request(code, exc.code, perf_counter() - started)
            raise
        if response is not None:
            self.parts.metrics.observe_request(code, response.code, perf_counter() - started)
        if response is None:
            raise GrpcError(pb.INTERNAL_SERVER_ERROR, f"request code {code} gave no response")
        if raise_error and response.code != 0:
            raise error_for(response.code, response.remark)
        return response


def resource_name(resource: pb.Resource, what: str) -> str:
    """A topic's or group's name; raises `GrpcError` ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP."""
    name = resource.name
    remark = check_topic(name) if what == "topic" else check_group(name)
    if remark is not None:
        raise GrpcError(pb.ILLEGAL_TOPIC if what == "topic" else pb.ILLEGAL_CONSUMER_GROUP, remark)
    return name

