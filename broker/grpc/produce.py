"""QueryRoute, QueryAssignment, Heartbeat, SendMessage, EndTransaction and NotifyClientTermination
of `apache.rocketmq.v2.MessagingService`, translated onto the broker's own requests (Java proxy:
`RouteActivity`, `SendMessageActivity`, `EndTransactionActivity`, `ClientActivity`)."""

from __future__ import annotations

import ipaddress
from typing import Any, TypeAlias

from broker.grpc.calls import Caller, GrpcCalls, resource_name
from broker.grpc.convert import born_timestamp_ms, send_properties
from broker.grpc.proto import definition_pb2 as pb
from broker.grpc.proto import service_pb2 as spb
from broker.grpc.sessions import parse_transaction_id, transaction_id
from broker.grpc.status import GrpcError, ok, status
from protocol.bodies import TopicRouteData
from protocol.codes import RequestCode
from protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.headers_v5 import EndTransactionRequestHeader
from protocol.message import msg_id_commit_log_offset
from protocol.transaction import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE

ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
MAX_MESSAGES_PER_SEND = 1_024       # a SendMessageRequest's messages (the clients send one at a time)
_RESOLUTIONS = {pb.COMMIT: TRANSACTION_COMMIT_TYPE, pb.ROLLBACK: TRANSACTION_ROLLBACK_TYPE}
_PERM_READ, _PERM_WRITE = 4, 2
Context: TypeAlias = Any      # grpc.aio.ServicerContext (grpcio ships no type stubs)


def _permission(perm: int) -> pb.Permission:
    """The gRPC `Permission` of a topic's perm bits (PermName: 4 read, 2 write)."""
    return {(True, True): pb.READ_WRITE, (True, False): pb.READ, (False, True): pb.WRITE}.get(
        (bool(perm & _PERM_READ), bool(perm & _PERM_WRITE)), pb.NONE)


def route_queues(topic: str, route: TopicRouteData) -> list[pb.MessageQueue]:
    """The gRPC message queues of a name server's route: each broker's whose master registered a
    gRPC address, queue ids 0 .. max(read, write) - 1."""
    brokers = {data.broker_name: data for data in route.broker_datas}
    queues: list[pb.MessageQueue] = []
    for queue_data in route.queue_datas:
        data = brokers.get(queue_data.broker_name)
        grpc_addr = data.grpc_addrs.get(0, "") if data is not None else ""
        host, _, port = grpc_addr.rpartition(":")
        if not host or not port.isascii() or not port.isdigit():
            continue
        broker = pb.Broker(name=queue_data.broker_name, id=0, endpoints=endpoints_of(host.strip("[]"), int(port)))
        permission = _permission(queue_data.perm)
        queues.extend(pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id, permission=permission,
                                      broker=broker, accept_message_types=ACCEPTED_TYPES)
                      for queue_id in range(max(queue_data.read_queue_nums, queue_data.write_queue_nums)))
    return queues


def endpoints_of(host: str, port: int) -> pb.Endpoints:
    """`Endpoints` of host:port: IPv4, IPv6 or a domain name, as the host is."""
    try:
        scheme = pb.IPv4 if ipaddress.ip_address(host).version == 4 else pb.IPv6
    except ValueError:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])


class ProduceCalls(GrpcCalls):
    def _broker(self) -> pb.Broker:
        host, port = self.endpoint()
        return pb.Broker(name=self.parts.config.broker_name, id=0, endpoints=endpoints_of(host, port))

    def _topic_config(self, topic: str) -> Any:
        """The topic's config; an unknown topic is made when auto-creation is on (as a send would),
        else TOPIC_NOT_FOUND."""
        topics = self.parts.topics
        config = topics.get(topic)
        if config is None:
            if not self.parts.config.auto_create_topic:
                raise GrpcError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
            config = topics.for_send(topic, 0)
        return config

    async def _route(self, topic: str) -> list[pb.MessageQueue]:
        """The topic's queues: with name servers, every broker's that registered a gRPC address
        (a topic they do not know yet: this broker's); alone, this broker's."""
        registration = self.parts.registration
        if registration is not None:
            route = await registration.topic_route(topic)
            if route is not None:
                queues = route_queues(topic, route)
                if queues:
                    return queues
        config = self._topic_config(topic)
        broker = self._broker()
        return [pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id, permission=_permission(config.perm),
                                broker=broker, accept_message_types=ACCEPTED_TYPES)
                for queue_id in range(max(config.read_queue_nums, config.write_queue_nums))]

    async def QueryRoute(self, request: spb.QueryRouteRequest, context: Context) -> spb.QueryRouteResponse:
        """Every queue of the topic, each with its broker's gRPC endpoint; the permission as the
        topic's on that broker (READ, WRITE or both), every message type accepted."""
        async def run(caller: Caller) -> spb.QueryRouteResponse:
            topic = resource_name(request.topic, "topic")
            return spb.QueryRouteResponse(status=ok(), message_queues=await self._route(topic))
        return await self.guarded(context, spb.QueryRouteResponse, run)

    async def QueryAssignment(self, request: spb.QueryAssignmentRequest,
                              context: Context) -> spb.QueryAssignmentResponse:
        """One assignment per broker with readable queues of the topic, queue id -1 (the broker
        picks the queue of each pop), as the proxy assigns a POP consumer group."""
        async def run(caller: Caller) -> spb.QueryAssignmentResponse:
            topic = resource_name(request.topic, "topic")
            resource_name(request.group, "group")
            assignments, brokers = [], set()
            for queue in await self._route(topic):
                if queue.permission in (pb.READ, pb.READ_WRITE) and queue.broker.name not in brokers:
                    brokers.add(queue.broker.name)
                    assigned = pb.MessageQueue(topic=queue.topic, id=-1, permission=queue.permission,
                                               broker=queue.broker, accept_message_types=ACCEPTED_TYPES)
                    assignments.append(pb.Assignment(message_queue=assigned))
            if not assignments:
                raise GrpcError(pb.FORBIDDEN, f"topic {topic!r} has no readable queue")
            return spb.QueryAssignmentResponse(status=ok(), assignments=assignments)
        return await self.guarded(context, spb.QueryAssignmentResponse, run)

    async def Heartbeat(self, request: spb.HeartbeatRequest, context: Context) -> spb.HeartbeatResponse:
        """Keeps a producer registered for its topics' transaction checks (the producer group of a
        gRPC transaction is its topic); needs an `x-mq-client-id`."""
        async def run(caller: Caller) -> spb.HeartbeatResponse:
            if caller.channel is None:
                raise GrpcError(pb.CLIENT_ID_REQUIRED, "x-mq-client-id metadata is required")
            self.register_producer(caller)
            return spb.HeartbeatResponse(status=ok())
        return await self.guarded(context, spb.HeartbeatResponse, run)

    def register_producer(self, caller: Caller) -> None:
        channel = caller.channel
        if channel is None or channel.client_type != pb.PRODUCER:
            return
        now_ms = self.parts.clock.now_ms()
        for topic in channel.topics:
            self.parts.producers.register(topic, channel, channel.client_id, now_ms)  # type: ignore[arg-type]

    async def SendMessage(self, request: spb.SendMessageRequest, context: Context) -> spb.SendMessageResponse:
        """Each message stored as a SEND_MESSAGE of its own (queue chosen by the client), one
        `SendResultEntry` each; the response's status is the first failure's, else OK."""
        async def run(caller: Caller) -> spb.SendMessageResponse:
            if not request.messages:
                raise GrpcError(pb.BAD_REQUEST, "no message to send")
            if len(request.messages) > MAX_MESSAGES_PER_SEND:
                raise GrpcError(pb.BAD_REQUEST, f"more than {MAX_MESSAGES_PER_SEND} messages in one send")
            entries = [await self._send_one(caller, message) for message in request.messages]
            failed = next((e.status for e in entries if e.status.code != pb.OK), None)
            return spb.SendMessageResponse(status=failed or ok(), entries=entries)
        return await self.guarded(context, spb.SendMessageResponse, run)

    async def _send_one(self, caller: Caller, message: pb.Message) -> spb.SendResultEntry:
        try:
            topic = resource_name(message.topic, "topic")
            if not message.body:
                raise GrpcError(pb.MESSAGE_BODY_EMPTY, "the message body is empty")
            limit = self.parts.config.store.max_message_bytes
            if len(message.body) > limit:
                raise GrpcError(pb.MESSAGE_BODY_TOO_LARGE, f"the body is over {limit} bytes")
            queue_id = message.system_properties.queue_id
            config = self._topic_config(topic)
            if not 0 <= queue_id < config.write_queue_nums:
                queue_id = 0
            properties = send_properties(message)
            header = SendMessageRequestHeader(
                producer_group=properties.get("PGROUP", "grpc-producer"), topic=topic, queue_id=queue_id,
                born_timestamp=born_timestamp_ms(message, self.parts.clock.now_ms()), properties=properties)
            response = await self.invoke(caller, RequestCode.SEND_MESSAGE, header, message.body)
            sent = SendMessageResponseHeader.from_fields(response.fields)
            msg_id = message.system_properties.message_id or sent.msg_id
            tx_id = (transaction_id(msg_id_commit_log_offset(sent.msg_id), sent.queue_offset)
                     if message.system_properties.message_type == pb.TRANSACTION else "")
            return spb.SendResultEntry(status=ok(), message_id=msg_id, transaction_id=tx_id,
                                       offset=sent.queue_offset)
        except Exception as exc:
            return spb.SendResultEntry(status=self.error_status(exc, caller),
                                       message_id=message.system_properties.message_id)

    async def EndTransaction(self, request: spb.EndTransactionRequest,
                             context: Context) -> spb.EndTransactionResponse:
        """COMMIT or ROLLBACK the half message `transaction_id` names (an UNSPECIFIED resolution
        leaves it to the next check-back)."""
        async def run(caller: Caller) -> spb.EndTransactionResponse:
            topic = resource_name(request.topic, "topic")
            where = parse_transaction_id(request.transaction_id)
            if where is None:
                raise GrpcError(pb.INVALID_TRANSACTION_ID, f"transaction id {request.transaction_id[:64]!r} is not one"
                                                           " this broker gave")
            action = _RESOLUTIONS.get(request.resolution, TRANSACTION_NOT_TYPE)
            header = EndTransactionRequestHeader(
                producer_group=topic, topic=topic, tran_state_table_offset=where[1], commit_log_offset=where[0],
                commit_or_rollback=action, from_transaction_check=request.source == pb.SOURCE_SERVER_CHECK,
                msg_id=request.message_id[:128], transaction_id=request.message_id[:128])
            await self.invoke(caller, RequestCode.END_TRANSACTION, header)
            return spb.EndTransactionResponse(status=ok())
        return await self.guarded(context, spb.EndTransactionResponse, run)

    async def NotifyClientTermination(self, request: spb.NotifyClientTerminationRequest,
                                      context: Context) -> spb.NotifyClientTerminationResponse:
        async def run(caller: Caller) -> spb.NotifyClientTerminationResponse:
            if caller.channel is not None:
                removed = self.sessions.remove(caller.channel.client_id)
                if removed is not None:
                    self.forget(removed)
            return spb.NotifyClientTerminationResponse(status=ok())
        return await self.guarded(context, spb.NotifyClientTerminationResponse, run)


def unsupported(what: str) -> pb.Status:
    return status(pb.UNSUPPORTED, f"{what} is not served by rocketq's gRPC API")
