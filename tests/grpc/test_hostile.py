"""Hostile and careless gRPC clients: invalid names, out-of-range values, garbage handles and ids,
oversized messages, receive streams never read, a Telemetry stream that only writes. Each gets a
clear status, and the broker keeps serving everyone else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.broker import Broker
from broker.grpc.proto import definition_pb2 as pb
from broker.grpc.proto import service_pb2 as spb
from broker.grpc.proto import service_pb2_grpc
from broker.grpc.sessions import MAX_QUEUED_COMMANDS
from conf.store import StoreConfig
from tests.conftest import broker_config
from tests.grpc.conftest import endpoint
from tests.helpers import free_port, wait_until

META = (("x-mq-client-id", "hostile-client"),)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    config = broker_config(tmp_path, grpc_port=free_port())
    store = StoreConfig(**{**{f: getattr(config.store, f) for f in ("path", "commit_log_segment_bytes",
                                                                     "consume_queue_segment_units",
                                                                     "message_delay_level")},
                           "max_message_bytes": 64 * 1024})
    async with Broker(broker_config(tmp_path, grpc_port=config.grpc_port, store=store)) as running:
        yield running


@pytest.fixture
async def stub(broker: Broker) -> AsyncIterator[service_pb2_grpc.MessagingServiceStub]:
    async with grpc.aio.insecure_channel(endpoint(broker)) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]


def msg(topic: str, body: bytes = b"x", message_id: str = "01AB") -> pb.Message:
    out = pb.Message(body=body)
    out.topic.name = topic
    out.system_properties.message_id = message_id
    return out


def receive_request(topic: str = "t", group: str = "g", batch: int = 16, invisible_s: int = 30,
                    poll_s: int = 1) -> spb.ReceiveMessageRequest:
    request = spb.ReceiveMessageRequest(batch_size=batch, invisible_duration=Duration(seconds=invisible_s),
                                        long_polling_timeout=Duration(seconds=poll_s))
    request.group.name = group
    request.message_queue.topic.name = topic
    request.message_queue.id = -1
    return request


async def receive(stub: service_pb2_grpc.MessagingServiceStub, request: spb.ReceiveMessageRequest,
                  timeout_s: float = 10) -> tuple[list[pb.Message], int]:
    messages, code = [], -1
    async for response in stub.ReceiveMessage(request, metadata=META, timeout=timeout_s):
        if response.HasField("message"):
            messages.append(response.message)
        elif response.HasField("status"):
            code = response.status.code
    return messages, code


async def sends_and_receives(stub: service_pb2_grpc.MessagingServiceStub, topic: str) -> None:
    """The broker still serves: one message sent and received."""
    sent = await stub.SendMessage(spb.SendMessageRequest(messages=[msg(topic, b"still")]), metadata=META, timeout=5)
    assert sent.status.code == pb.OK
    messages, code = await receive(stub, receive_request(topic, "g-" + topic))
    assert code == pb.OK and [m.body for m in messages] == [b"still"]


async def test_invalid_names_are_refused_clearly(stub: service_pb2_grpc.MessagingServiceStub) -> None:
    route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="bad topic!")), metadata=META)
    assert route.status.code == pb.ILLEGAL_TOPIC
    route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="t" * 10_000)), metadata=META)
    assert route.status.code == pb.ILLEGAL_TOPIC
    sent = await stub.SendMessage(spb.SendMessageRequest(messages=[msg("bad/topic")]), metadata=META)
    assert sent.status.code == pb.ILLEGAL_TOPIC and sent.entries[0].status.code == pb.ILLEGAL_TOPIC
    _, code = await receive(stub, receive_request(group="bad group"))
    assert code == pb.ILLEGAL_CONSUMER_GROUP
    heartbeat = await stub.Heartbeat(spb.HeartbeatRequest(client_type=pb.PRODUCER))    # no client id
    assert heartbeat.status.code == pb.CLIENT_ID_REQUIRED


async def test_out_of_range_values_are_refused(stub: service_pb2_grpc.MessagingServiceStub) -> None:
    for request, expected in [(receive_request(batch=100_000), pb.BAD_REQUEST),
                              (receive_request(batch=0), pb.BAD_REQUEST),
                              (receive_request(invisible_s=10**12), pb.ILLEGAL_INVISIBLE_TIME),
                              (receive_request(invisible_s=0), pb.ILLEGAL_INVISIBLE_TIME),
                              (receive_request(poll_s=10**9), pb.ILLEGAL_POLLING_TIME)]:
        assert (await receive(stub, request))[1] == expected
    late = msg("t")
    late.system_properties.delivery_timestamp.seconds = 10**11
    sent = await stub.SendMessage(spb.SendMessageRequest(messages=[late]), metadata=META)
    assert sent.status.code == pb.BAD_REQUEST
    sent = await stub.SendMessage(spb.SendMessageRequest(messages=[msg("t")] * 2_000), metadata=META)
    assert sent.status.code == pb.BAD_REQUEST
    empty = await stub.SendMessage(spb.SendMessageRequest(messages=[msg("t", b"")]), metadata=META)
    assert empty.status.code == pb.MESSAGE_BODY_EMPTY
    large = await stub.SendMessage(spb.SendMessageRequest(messages=[msg("t", b"x" * 65_537)]), metadata=META)
    assert large.status.code == pb.MESSAGE_BODY_TOO_LARGE
    with pytest.raises(grpc.aio.AioRpcError) as refused:      # past the port's message limit: gRPC's own refusal
        await stub.SendMessage(spb.SendMessageRequest(messages=[msg("t", b"x" * 2_000_000)]), metadata=META)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    reserved = msg("t")
    reserved.user_properties["UNIQ_KEY"] = "forged"
    sent = await stub.SendMessage(spb.SendMessageRequest(messages=[reserved]), metadata=META)
    assert sent.status.code == pb.BAD_REQUEST
    await sends_and_receives(stub, "after-range")


async def test_garbage_handles_and_transaction_ids(stub: service_pb2_grpc.MessagingServiceStub) -> None:
    for handle in ["", "garbage", "1 2 3 4 5 6 7 8", "-1 0 0 0 0 b 0 0", "9" * 5_000]:
        ack = await stub.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name="g"), topic=pb.Resource(name="t"),
            entries=[spb.AckMessageEntry(message_id="m", receipt_handle=handle)]), metadata=META)
        assert ack.status.code == pb.INVALID_RECEIPT_HANDLE, handle
        change = await stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
            group=pb.Resource(name="g"), topic=pb.Resource(name="t"), receipt_handle=handle,
            invisible_duration=Duration(seconds=10)), metadata=META)
        assert change.status.code == pb.INVALID_RECEIPT_HANDLE, handle
        forward = await stub.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name="g"), topic=pb.Resource(name="t"), receipt_handle=handle), metadata=META)
        assert forward.status.code == pb.INVALID_RECEIPT_HANDLE, handle
    for transaction_id in ["", "x", "1:", ":2", "1:2:3", "9" * 100 + ":1"]:
        end = await stub.EndTransaction(spb.EndTransactionRequest(
            topic=pb.Resource(name="t"), transaction_id=transaction_id, resolution=pb.COMMIT), metadata=META)
        assert end.status.code == pb.INVALID_TRANSACTION_ID, transaction_id
    end = await stub.EndTransaction(spb.EndTransactionRequest(      # well formed, but no such half message
        topic=pb.Resource(name="t"), transaction_id="123456:7", resolution=pb.COMMIT), metadata=META)
    assert end.status.code != pb.OK
    await sends_and_receives(stub, "after-garbage")


async def test_receive_streams_never_read_do_not_stop_the_broker(broker: Broker,
                                                                 stub: service_pb2_grpc.MessagingServiceStub) -> None:
    """Fifty held receives left unread (and then dropped by their client) while others go on."""
    await sends_and_receives(stub, "idle")      # the topic exists and g-idle has nothing left: receives hold
    calls = [stub.ReceiveMessage(receive_request("idle", "g-idle", poll_s=20), metadata=META, timeout=30)
             for _ in range(50)]
    await asyncio.sleep(0)
    await sends_and_receives(stub, "busy")
    assert not any(call.done() for call in calls), "the receives are held (not answered at once)"
    for call in calls:
        call.cancel()
    await sends_and_receives(stub, "busy2")


async def test_a_telemetry_stream_that_only_writes_is_bounded(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    """Settings sent without reading the answers: once the answers waiting reach the bound the
    broker stops reading that stream (memory stays bounded); everyone else is served. The client's
    HTTP/2 window is kept at its first 64 KiB (no BDP probing), so unread answers back up soon."""
    settings = spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER))
    for i in range(1_500):                          # the client's lists are not echoed: small answers
        settings.settings.publishing.topics.add(name=f"t{i}")

    async def flood() -> AsyncIterator[spb.TelemetryCommand]:
        for _ in range(MAX_QUEUED_COMMANDS * 20):
            yield settings
    caplog.set_level(logging.INFO, logger="broker.grpc.telemetry")
    async with grpc.aio.insecure_channel(endpoint(broker), options=[("grpc.http2.bdp_probe", 0)]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Telemetry(flood(), metadata=META, timeout=60)       # its answers are never read
        await wait_until(lambda: "telemetry answers unread" in caplog.text, timeout_s=30, what="the bound reached")
        grpc_server = broker.grpc
        assert grpc_server is not None
        client = grpc_server.sessions.get("hostile-client")
        assert client is not None and client.stream is not None
        assert client.stream.qsize() <= MAX_QUEUED_COMMANDS + 1 and len(client.topics) == 1_000
        await sends_and_receives(stub, "after-flood")
        call.cancel()


async def test_stop_ends_held_receives_and_streams(tmp_path: Path) -> None:
    async with Broker(broker_config(tmp_path, grpc_port=free_port())) as broker, \
            grpc.aio.insecure_channel(endpoint(broker)) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        broker.topics.for_send("held", 0)
        held = asyncio.ensure_future(receive(stub, receive_request("held", poll_s=60), timeout_s=90))
        telemetry = stub.Telemetry(iter([spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER))]),
                                   metadata=META)
        first = await telemetry.read()
        assert first.status.code == pb.OK
        await asyncio.sleep(0.2)
        await asyncio.wait_for(broker.stop(), 10)
        messages, code = await asyncio.wait_for(held, 10)
        assert messages == [] and code == pb.MESSAGE_NOT_FOUND


async def test_calls_past_grpc_max_concurrent_calls_are_refused_then_served(tmp_path: Path) -> None:
    """A client holding `grpc_max_concurrent_calls` receives open: one more call is answered
    RESOURCE_EXHAUSTED (the clients' retry status), and served once the held ones end."""
    config = broker_config(tmp_path, grpc_port=free_port(), grpc_max_concurrent_calls=4)
    async with Broker(config) as running, grpc.aio.insecure_channel(endpoint(running)) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]

        async def exhausted() -> bool:
            try:
                await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="t")), metadata=META, timeout=5)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                return True
            return False

        async def until(wanted: bool) -> None:
            async with asyncio.timeout(10):
                while await exhausted() != wanted:
                    await asyncio.sleep(0.01)

        await sends_and_receives(stub, "idle")      # the topic exists and g-idle has nothing left: receives hold
        assert not await exhausted()
        held = [stub.ReceiveMessage(receive_request("idle", "g-idle", poll_s=20), metadata=META, timeout=30)
                for _ in range(4)]
        await until(True)           # the four held receives are running on the broker
        assert not any(call.done() for call in held)
        for call in held:
            call.cancel()
        await until(False)
        await sends_and_receives(stub, "after")
