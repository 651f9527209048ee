"""rocketq's own clients and RocketMQ's official client on one broker: what one sends the other
receives with topic, tag, keys, properties, body and message id intact."""

from __future__ import annotations

from rocketmq import FilterExpression, Producer, SimpleConsumer

from broker.broker import Broker
from client import SimpleConsumer as RocketqSimpleConsumer
from client.producer.producer import Producer as RocketqProducer
from protocol.message import Message as RocketqMessage
from tests.grpc.conftest import blocking
from tests.grpc.test_official_producer import config, message, receive_all


def _official_receive(broker: Broker, topic: str, group: str, count: int) -> list[tuple[object, ...]]:
    consumer = SimpleConsumer(config(broker), group, {topic: FilterExpression()}, await_duration=1)
    consumer.startup()
    try:
        got = receive_all(consumer, count)
        for m in got:
            consumer.ack(m)
        return [(m.topic, m.tag, m.keys, m.properties, m.body, m.message_id) for m in got]
    finally:
        consumer.shutdown()


async def test_rocketq_producer_to_official_simple_consumer(grpc_broker: Broker) -> None:
    async with RocketqProducer("pg", grpc_broker.address) as producer:
        result = await producer.send(RocketqMessage("interop", b"from rocketq", tags="tA", keys=["k1", "k2"],
                                                    properties={"color": "blue"}))
    assert result.uniq_keys
    got = await blocking(_official_receive, grpc_broker, "interop", "G-interop", 1)
    assert got == [("interop", "tA", {"k1", "k2"}, {"color": "blue"}, b"from rocketq", result.uniq_keys[0])]


def _official_send(broker: Broker, topic: str) -> str:
    producer = Producer(config(broker), (topic,))
    producer.startup()
    try:
        receipt = producer.send(message(topic, b"from official", tag="tB", keys="k3", properties={"size": "L"}))
        return str(receipt.message_id)
    finally:
        producer.shutdown()


async def test_official_producer_to_rocketq_simple_consumer(grpc_broker: Broker) -> None:
    message_id = await blocking(_official_send, grpc_broker, "interop2")
    consumer = RocketqSimpleConsumer("G-interop2", grpc_broker.address, subscriptions={"interop2": "*"},
                                     await_duration_s=1)
    await consumer.start()
    try:
        got = await consumer.receive(16, invisible_duration_s=30)
        for m in got:
            await consumer.ack(m)
    finally:
        await consumer.shutdown()
    assert [(m.topic, m.tag, m.keys, m.ext.properties.get("size"), m.body, m.message_id) for m in got] == [
        ("interop2", "tB", ["k3"], "L", b"from official", message_id)]


async def test_grpc_calls_count_in_the_request_metrics(grpc_broker: Broker) -> None:
    """A gRPC send is a SEND_MESSAGE (10) in `rocketmq_rpc_latency`, as a remoting one is."""
    before = (await grpc_broker.metrics.render()).decode()
    await blocking(_official_send, grpc_broker, "metered")
    after = (await grpc_broker.metrics.render()).decode()

    def sends(text: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("rocketmq_rpc_latency_count") and 'request_code="10"' in line
                   and 'response_code="0"' in line)
    assert sends(after) - sends(before) >= 1
