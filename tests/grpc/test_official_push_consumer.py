"""The official client's PushConsumer against rocketq's gRPC API: a listener's SUCCESS acks, its
FAILURE has the message delivered again after the backoff the broker's settings gave, and past the
group's `retry_max_times` the broker moves it to `%DLQ%<group>`."""

from __future__ import annotations

import threading
import time
from typing import Any

from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, Producer, PushConsumer

from broker.broker import Broker
from broker.topics.subscription_group_manager import SubscriptionGroupConfig
from protocol.topics import dlq_topic
from tests.grpc.conftest import blocking
from tests.grpc.test_official_producer import config, message
from tests.helpers import wait_until


class Listener(MessageListener):  # type: ignore[misc]
    def __init__(self, result: Any, expected: int) -> None:
        self.result = result
        self.seen: list[tuple[bytes, int]] = []
        self.expected = expected
        self.done = threading.Event()

    def consume(self, message: Message) -> Any:
        self.seen.append((message.body, message.delivery_attempt))
        if len(self.seen) >= self.expected:
            self.done.set()
        return self.result


def _push(broker: Broker, topic: str, group: str, result: Any, bodies: list[bytes], expected: int) -> Listener:
    listener = Listener(result, expected)
    producer = Producer(config(broker), (topic,))
    consumer = PushConsumer(config(broker), group, listener, {topic: FilterExpression()})
    producer.startup()
    consumer.startup()
    try:
        for body in bodies:
            producer.send(message(topic, body))
        assert listener.done.wait(15), f"listener saw {listener.seen}"
        time.sleep(0)   # let the consumption thread hand its result over
        return listener
    finally:
        producer.shutdown()
        consumer.shutdown()


async def test_push_consumer_success_acks_each_message_once(grpc_broker: Broker) -> None:
    bodies = [f"m{i}".encode() for i in range(10)]
    listener = await blocking(_push, grpc_broker, "push-ok", "G-push-ok", ConsumeResult.SUCCESS, bodies, 10,
                              timeout_s=30)
    assert sorted(body for body, _ in listener.seen) == sorted(bodies)
    assert {attempt for _, attempt in listener.seen} == {1}
    pop = grpc_broker.pop_service
    assert pop is not None
    await wait_until(lambda: all(not s.in_flight for (g, _, _), s in pop.queues.items() if g == "G-push-ok"),
                     what="every delivery acked")


async def test_push_consumer_failure_retries_then_dead_letters(grpc_broker: Broker) -> None:
    grpc_broker.groups.update(SubscriptionGroupConfig(group_name="G-push-fail", retry_max_times=1))
    listener = await blocking(_push, grpc_broker, "push-fail", "G-push-fail", ConsumeResult.FAILURE, [b"bad"], 2,
                              timeout_s=30)
    assert listener.seen[:2] == [(b"bad", 1), (b"bad", 2)]
    store = grpc_broker.store
    assert store is not None
    await wait_until(lambda: store.get_max_offset(dlq_topic("G-push-fail"), 0) == 1, timeout_s=10,
                     what="the message in the DLQ")


async def test_fifo_push_consumer_failure_forwards_to_the_dlq(grpc_broker: Broker) -> None:
    """A FIFO group's consumer retries in place, then calls ForwardMessageToDeadLetterQueue."""
    grpc_broker.groups.update(SubscriptionGroupConfig(group_name="G-fifo-fail", retry_max_times=1,
                                                      consume_message_orderly=True))
    listener = await blocking(_push, grpc_broker, "fifo-fail", "G-fifo-fail", ConsumeResult.FAILURE, [b"bad"], 2,
                              timeout_s=30)
    assert [body for body, _ in listener.seen[:2]] == [b"bad", b"bad"]
    store = grpc_broker.store
    assert store is not None
    await wait_until(lambda: store.get_max_offset(dlq_topic("G-fifo-fail"), 0) == 1, timeout_s=10,
                     what="the message in the DLQ")
    pop = grpc_broker.pop_service
    assert pop is not None
    assert pop.dlq_count == 1
