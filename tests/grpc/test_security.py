"""The gRPC API under the broker's `[auth]` and `[tls]`: the official client's `Credentials(ak, sk)`
signature (sk: the user's signing key in hex) checked against the users and ACLs; TLS on the port."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from broker.broker import Broker
from broker.grpc.proto import service_pb2 as spb
from broker.grpc.proto import service_pb2_grpc
from broker.grpc.proto.definition_pb2 import FORBIDDEN, OK, UNAUTHORIZED, Message, Resource
from conf.devcerts import CertFiles, server_tls
from protocol.signing import signing_key
from tests.conftest import broker_config
from tests.grpc.conftest import blocking, endpoint
from tests.grpc.test_official_producer import message
from tests.helpers import free_port
from tests.security_helpers import add_user, secured_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def secured_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(secured_config(tmp_path, lenient=True, grpc_port=free_port())) as broker:
        yield broker


def _send_receive(address: str, ak: str, sk: str, topic: str, group: str) -> list[bytes]:
    config = ClientConfiguration(address, Credentials(ak, sk), request_timeout=3)
    producer = Producer(config, (topic,))
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        producer.send(message(topic, b"signed"))
        got = consumer.receive(16, 15)
        for m in got:
            consumer.ack(m)
        return [m.body for m in got]
    finally:
        producer.shutdown()
        consumer.shutdown()


def _send(address: str, ak: str, sk: str, topic: str) -> None:
    producer = Producer(ClientConfiguration(address, Credentials(ak, sk), request_timeout=2), (topic,))
    producer.startup()
    try:
        producer.send(message(topic, b"refused"))
    finally:
        producer.shutdown()


async def test_signed_by_a_user_whose_acl_allows_it(secured_broker: Broker) -> None:
    user = await add_user(secured_broker.address, "alice", [("Topic:sec", ["Pub", "Sub"]), ("Group:G-sec", ["Sub"])])
    sk = signing_key(user.access_key, user.secret_key).hex()
    bodies = await blocking(_send_receive, endpoint(secured_broker), "alice", sk, "sec", "G-sec", timeout_s=30)
    assert bodies == [b"signed"]


@pytest.mark.parametrize("ak,sk", [("alice", "0" * 64), ("nobody", "0" * 64), ("", "")])
async def test_a_wrong_signature_is_refused_and_nothing_is_stored(secured_broker: Broker, ak: str, sk: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    await add_user(secured_broker.address, "alice", [("Topic:sec", ["Pub"])])
    with pytest.raises(Exception, match="route"):      # the client keeps the cause in its log
        await blocking(_send, endpoint(secured_broker), ak, sk, "sec", timeout_s=30)
    assert "40100" in caplog.text and "authentication failed" in caplog.text
    store = secured_broker.store
    assert store is not None and store.get_max_offset("sec", 0) == 0


def _stub_call(address: str, ak: str, sk: str, topic: str) -> tuple[int, int]:
    """A raw QueryRoute and SendMessage signed as (ak, sk), as the clients sign."""
    from datetime import datetime

    from broker.grpc.auth import sign
    stamp = datetime.now().strftime("%Y%m%dT%H%M%SZ")
    metadata = [("x-mq-date-time", stamp), ("x-mq-client-id", "stub-client"),
                ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, "
                                  f"Signature={sign(sk, stamp)}")]
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        route = stub.QueryRoute(spb.QueryRouteRequest(topic=Resource(name=topic)), metadata=metadata, timeout=5)
        sent = stub.SendMessage(spb.SendMessageRequest(messages=[message_proto(topic)]), metadata=metadata, timeout=5)
        return route.status.code, sent.status.code


def message_proto(topic: str) -> Message:
    out = Message(body=b"x")
    out.topic.name = topic
    out.system_properties.message_id = "01" + "0" * 32
    return out


async def test_an_acl_without_pub_is_forbidden(secured_broker: Broker) -> None:
    user = await add_user(secured_broker.address, "bob", [("Topic:sec", ["Sub"])])
    sk = signing_key(user.access_key, user.secret_key).hex()
    route_code, send_code = await blocking(_stub_call, endpoint(secured_broker), "bob", sk, "sec")
    assert (route_code, send_code) == (OK, FORBIDDEN)
    other = await blocking(_stub_call, endpoint(secured_broker), "bob", "f" * 64, "sec")
    assert other == (UNAUTHORIZED, UNAUTHORIZED)


TLS_CLIENT = textwrap.dedent("""
    import sys
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
    config = ClientConfiguration(sys.argv[1], Credentials(), request_timeout=3)
    producer = Producer(config, ("tls",), tls_enable=True)
    consumer = SimpleConsumer(config, "G-tls", {"tls": FilterExpression()}, await_duration=1, tls_enable=True)
    producer.startup(); consumer.startup()
    try:
        m = Message(); m.topic = "tls"; m.body = b"over tls"
        producer.send(m)
        got = []
        for _ in range(5):
            got += consumer.receive(16, 15)
            if got:
                break
        for x in got:
            consumer.ack(x)
        print("BODIES", [x.body for x in got])
    finally:
        producer.shutdown(); consumer.shutdown()
""")


async def test_tls_with_the_official_client(tmp_path: Path, tls_certs: CertFiles) -> None:
    """The client trusts the test CA through gRPC's GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (it passes no
    roots of its own), so it runs in a process of its own."""
    config = broker_config(tmp_path, grpc_port=free_port(), tls=server_tls(tls_certs, "enforcing"))
    async with Broker(config) as broker:
        env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": tls_certs.ca_file,
               "PYTHONPATH": str(REPO)}
        result = await blocking(lambda: subprocess.run(
            [sys.executable, "-c", TLS_CLIENT, endpoint(broker)], env=env, capture_output=True, text=True,
            timeout=40), timeout_s=45)
        assert "BODIES [b'over tls']" in result.stdout, result.stderr[-2000:]
        plaintext = await blocking(_plaintext_route, endpoint(broker))
        assert plaintext == grpc.StatusCode.UNAVAILABLE


def _plaintext_route(address: str) -> object:
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.QueryRoute(spb.QueryRouteRequest(topic=Resource(name="tls")), timeout=3)
        except grpc.RpcError as err:
            return err.code()
        return None


async def test_repeated_bad_signatures_rate_limit_the_address(tmp_path: Path) -> None:
    """The remoting port's failure limit holds for gRPC calls too: past it, even a right signature
    from that address is refused until the window ends."""
    async with Broker(secured_config(tmp_path, grpc_port=free_port())) as broker:
        user = await add_user(broker.address, "carol", [("Topic:sec", ["Pub", "Sub"])])
        sk = signing_key(user.access_key, user.secret_key).hex()
        assert await blocking(_stub_call, endpoint(broker), "carol", sk, "sec") == (OK, OK)
        for _ in range(broker.config.auth.max_failures_per_address):
            assert await blocking(_stub_call, endpoint(broker), "carol", "0" * 64, "sec") == (UNAUTHORIZED,
                                                                                           UNAUTHORIZED)
        assert await blocking(_stub_call, endpoint(broker), "carol", sk, "sec") == (UNAUTHORIZED, UNAUTHORIZED)
