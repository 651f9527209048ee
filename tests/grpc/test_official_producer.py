"""The official Python client (`rocketmq-python-client`, unmodified) against rocketq's gRPC API:
a Producer sends normal, FIFO, delayed and transactional messages; a SimpleConsumer receives them."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

from broker.broker import Broker
from tests.conftest import broker_config
from tests.grpc.conftest import blocking, endpoint
from tests.helpers import free_port


def config(broker: Broker) -> ClientConfiguration:
    return ClientConfiguration(endpoint(broker), Credentials(), request_timeout=5)


def message(topic: str, body: bytes, **fields: object) -> Message:
    out = Message()
    out.topic, out.body = topic, body
    for key, value in fields.items():
        if key == "keys":
            out.keys = value
        elif key == "properties":
            for name, text in value.items():        # type: ignore[attr-defined]
                out.add_property(name, text)
        else:
            setattr(out, key, value)
    return out


def receive_all(consumer: SimpleConsumer, count: int, timeout_s: float = 10.0, invisible_s: int = 15) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(consumer.receive(16, invisible_s))
    return got


def send_and_receive(broker: Broker, topic: str, messages: list[Message], *,
                     ack: bool = True) -> tuple[list[Any], list[Message]]:
    producer = Producer(config(broker), (topic,))
    consumer = SimpleConsumer(config(broker), "G-" + topic, {topic: FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        receipts = [producer.send(m) for m in messages]
        got = receive_all(consumer, len(messages))
        if ack:
            for m in got:
                consumer.ack(m)
        return receipts, got
    finally:
        producer.shutdown()
        consumer.shutdown()


async def test_normal_message_intact(grpc_broker: Broker) -> None:
    sent = message("orders", b"hello", tag="tagA", keys="k1", properties={"color": "red"})
    receipts, got = await blocking(send_and_receive, grpc_broker, "orders", [sent])
    assert len(got) == 1
    received = got[0]
    assert received.message_id == receipts[0].message_id
    assert (received.topic, received.body, received.tag, received.keys) == ("orders", b"hello", "tagA", {"k1"})
    assert received.properties == {"color": "red"}
    assert received.delivery_attempt == 1


async def test_fifo_messages_keep_their_group_and_order(grpc_broker: Broker) -> None:
    sent = [message("fifo", f"m{i}".encode(), message_group="g1") for i in range(5)]
    _, got = await blocking(send_and_receive, grpc_broker, "fifo", sent)
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(5)]
    assert {m.message_group for m in got} == {"g1"}


def _send_delayed(broker: Broker) -> tuple[float, float]:
    producer = Producer(config(broker), ("delayed",))
    consumer = SimpleConsumer(config(broker), "G-delayed", {"delayed": FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        due_s = int(time.time()) + 3       # at least 2 s away: the early receive below polls 1 s
        producer.send(message("delayed", b"later", delivery_timestamp=due_s))
        early = consumer.receive(16, 15)
        assert early == []
        got = receive_all(consumer, 1, timeout_s=8)
        assert [m.body for m in got] == [b"later"]
        consumer.ack(got[0])
        return due_s, time.time()
    finally:
        producer.shutdown()
        consumer.shutdown()


async def test_delayed_message_not_before_its_delivery_time(grpc_broker: Broker) -> None:
    due_s, received_at = await blocking(_send_delayed, grpc_broker)
    assert received_at >= due_s - 0.05


class Checker(TransactionChecker):  # type: ignore[misc]
    def __init__(self) -> None:
        self.checked: list[str] = []
        self.event = threading.Event()

    def check(self, message: Message) -> TransactionResolution:
        self.checked.append(message.message_id)
        self.event.set()
        return TransactionResolution.COMMIT


def _transactions(broker: Broker) -> tuple[list[bytes], Checker, str]:
    checker = Checker()
    producer = Producer(config(broker), ("tx",), checker=checker)
    consumer = SimpleConsumer(config(broker), "G-tx", {"tx": FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        committed = producer.begin_transaction()
        producer.send(message("tx", b"commit"), committed)
        committed.commit()
        rolled_back = producer.begin_transaction()
        producer.send(message("tx", b"rollback"), rolled_back)
        rolled_back.rollback()
        orphan = producer.begin_transaction()      # never ended: the broker checks it back
        orphan_receipt = producer.send(message("tx", b"checked"), orphan)
        assert checker.event.wait(10), "no transaction check-back came"
        got = receive_all(consumer, 2)
        for m in got:
            consumer.ack(m)
        extra = consumer.receive(16, 15)
        return sorted(m.body for m in got + extra), checker, orphan_receipt.message_id
    finally:
        producer.shutdown()
        consumer.shutdown()


async def test_transactions_commit_rollback_and_check_back(grpc_broker: Broker) -> None:
    bodies, checker, orphan_id = await blocking(_transactions, grpc_broker, timeout_s=30)
    assert bodies == [b"checked", b"commit"]
    assert orphan_id in checker.checked


def _invisible_then_again(broker: Broker) -> tuple[int, int, bytes]:
    producer = Producer(config(broker), ("inv",))
    consumer = SimpleConsumer(config(broker), "G-inv", {"inv": FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        producer.send(message("inv", b"again"))
        first = receive_all(consumer, 1, invisible_s=2)
        assert len(first) == 1
        consumer.change_invisible_duration(first[0], 1)   # sooner than the 2 s first asked
        second = receive_all(consumer, 1, timeout_s=8, invisible_s=15)
        assert len(second) == 1
        consumer.ack(second[0])
        assert consumer.receive(16, 15) == []
        return first[0].delivery_attempt, second[0].delivery_attempt, second[0].body
    finally:
        producer.shutdown()
        consumer.shutdown()


async def test_unacked_message_is_seen_again_after_its_invisible_duration(grpc_broker: Broker) -> None:
    first, second, body = await blocking(_invisible_then_again, grpc_broker)
    assert (first, second, body) == (1, 2, b"again")


def _slow_and_fast(broker: Broker) -> tuple[set[bytes], set[bytes]]:
    producer = Producer(config(broker), ("shared",))
    slow = SimpleConsumer(config(broker), "G-shared", {"shared": FilterExpression()}, await_duration=1)
    fast = SimpleConsumer(config(broker), "G-shared", {"shared": FilterExpression()}, await_duration=1)
    for client in (producer, slow, fast):
        client.startup()
    try:
        for i in range(20):
            producer.send(message("shared", f"m{i}".encode()))
        held = slow.receive(4, 30)                  # the slow one sits on its batch
        taken = receive_all(fast, 20 - len(held))
        for m in taken:
            fast.ack(m)
        assert fast.receive(16, 30) == []           # nothing of the slow one's batch leaks meanwhile
        for m in held:
            slow.ack(m)
        return {m.body for m in held}, {m.body for m in taken}
    finally:
        for client in (producer, slow, fast):
            client.shutdown()


async def test_a_slow_consumer_holds_its_batch_while_a_fast_one_takes_the_rest(grpc_broker: Broker) -> None:
    held, taken = await blocking(_slow_and_fast, grpc_broker, timeout_s=30)
    assert held and not held & taken
    assert held | taken == {f"m{i}".encode() for i in range(20)}


def _unacked_bound(broker: Broker) -> tuple[int, int]:
    producer = Producer(config(broker), ("bounded",))
    consumer = SimpleConsumer(config(broker), "G-bounded", {"bounded": FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        for i in range(12):
            producer.send(message("bounded", f"m{i}".encode()))
        held = receive_all(consumer, 12, timeout_s=3)      # never acked: the queue's in-flight bound stops it
        for m in held:
            consumer.ack(m)
        rest: list[Message] = []
        deadline = time.monotonic() + 10
        while len(held) + len(rest) < 12 and time.monotonic() < deadline:
            batch = consumer.receive(16, 15)
            assert len(batch) <= 4
            for m in batch:                              # acked as they come: the bound moves on
                consumer.ack(m)
            rest.extend(batch)
        return len(held), len(held) + len(rest)
    finally:
        producer.shutdown()
        consumer.shutdown()


async def test_unacked_messages_are_bounded_per_queue(tmp_path: Path) -> None:
    """Flow control: a consumer that does not ack gets at most `pop_max_in_flight_per_queue`
    messages of a queue; acking them lets the rest through."""
    async with Broker(broker_config(tmp_path, grpc_port=free_port(), default_queue_nums=1,
                                    pop_max_in_flight_per_queue=4)) as broker:
        held, total = await blocking(_unacked_bound, broker, timeout_s=30)
    assert (held, total) == (4, 12)
