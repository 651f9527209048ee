"""Client metrics (`metrics_port=`): process and await time, cached messages and bytes per queue,
send cost, scraped over HTTP from the client's own endpoint."""

from __future__ import annotations

import asyncio
import threading
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from broker.broker import Broker
from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from client.api import ClientAPI
from tests.helpers import free_port, wait_until


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


async def test_client_metrics_are_served_when_asked_for(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "metered", queue_nums=1)
    release = threading.Event()
    consumed: list[bytes] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        release.wait(10)                         # hold the cache full until the scrape
        consumed.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer_port, producer_port = free_port(), free_port()
    consumer = PushConsumer("metered-g", broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            metrics_port=consumer_port, consume_thread_min=1, consume_thread_max=1)
    consumer.subscribe("metered")
    consumer.register_listener(listener)
    try:
        async with Producer("metered-pg", broker.address, metrics_port=producer_port) as producer, consumer:
            for i in range(5):
                await producer.send(Message("metered", b"x" * 100 + str(i).encode()))
            pq_of = consumer.process_queue
            await wait_until(lambda: any((pq := pq_of(mq)) is not None and pq.msg_count == 5
                                         for mq in consumer.assigned_queues("metered")), 5, "5 cached")
            samples = await asyncio.to_thread(scrape, consumer_port)
            cached = {labels["queue_id"]: value for labels, value in samples["rocketmq_consumer_cached_messages"]
                      if labels["topic"] == "metered"}
            assert cached == {"0": 5.0}
            assert [v for labels, v in samples["rocketmq_consumer_cached_bytes"]
                    if labels["topic"] == "metered"] == [505.0]
            release.set()
            await wait_until(lambda: len(consumed) == 5, 5)
            samples = await asyncio.to_thread(scrape, consumer_port)
            assert sum(v for labels, v in samples["rocketmq_process_time_count"] if labels["topic"] == "metered") >= 1
            assert sum(v for labels, v in samples["rocketmq_await_time_count"] if labels["topic"] == "metered") >= 1
            sends = await asyncio.to_thread(scrape, producer_port)
            assert [(labels["invocation_status"], v) for labels, v in sends["rocketmq_send_cost_time_count"]
                    if labels["topic"] == "metered"] == [("success", 5.0)]
    finally:
        release.set()
