"""`rocketq admin consumer ...` and `offset reset` against a real broker with two push consumers
running: progress shows owners and lag, status shows each client's process queues, and a reset to
the earliest offsets makes both consumers consume everything again from there."""

from __future__ import annotations

import time
from collections.abc import Callable

from broker.broker import Broker
from client import PushConsumer
from client.api import ClientAPI
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.client.test_push_consumer import Collector, consumer, produce
from tests.helpers import wait_until

TOPIC, GROUP, COUNT = "reset-me", "resetters", 40


def committed_everything(broker: Broker) -> Callable[[], bool]:
    store = broker.store
    assert store is not None
    return lambda: all(broker.offsets.query(GROUP, TOPIC, q) == store.get_max_offset(TOPIC, q) for q in range(4))


async def test_progress_status_and_a_live_reset_with_two_consumers(broker: Broker, client_api: ClientAPI) -> None:
    ep = ("--endpoints", broker.address)
    keys = await produce(broker.address, TOPIC, COUNT, batch=4)   # batches spread over the 4 queues
    first, second = Collector(), Collector()
    consumers: list[PushConsumer] = [consumer(broker.address, GROUP, TOPIC, first),
                                     consumer(broker.address, GROUP, TOPIC, second)]
    for c in consumers:
        await c.start()
    try:
        await wait_until(lambda: set(first.keys) | set(second.keys) == set(keys) and
                         all(len([q for q in c.assigned_queues() if q.topic == TOPIC]) == 2 for c in consumers),
                         20, "first round consumed")
        await wait_until(committed_everything(broker), 10, "offsets committed")

        progress = await rocketq_json("admin", "consumer", "progress", "-g", GROUP, *ep)
        topic_queues = [q for q in progress["queues"] if q["topic"] == TOPIC]
        assert [q["lag"] for q in topic_queues] == [0, 0, 0, 0] and progress["total_lag"] == 0
        assert {q["owner"] for q in topic_queues} == {c.client_id for c in consumers}
        table = await rocketq("admin", "consumerProgress", "-g", GROUP, *ep)
        assert table.exit_code == 0 and "total lag 0" in table.output

        connection = await rocketq_json("admin", "consumer", "connection", "-g", GROUP, *ep)
        assert sorted(c["client_id"] for c in connection["connection_set"]) == sorted(
            str(c.client_id) for c in consumers)
        assert connection["message_model"] == "CLUSTERING"

        status = await rocketq_json("admin", "consumer", "status", "-g", GROUP, *ep)
        assert len(status["clients"]) == 2
        for client in status["clients"]:
            mine = [q for q in client["mq_table"] if q["topic"] == TOPIC]
            assert len(mine) == 2 and all(q["locked"] is False and q["cached_msg_count"] == 0 for q in mine)
        status_table = await rocketq("admin", "consumer", "status", "-g", GROUP, *ep)
        assert status_table.exit_code == 0 and "cached msgs" in status_table.output

        first.keys.clear()
        second.keys.clear()
        reset = await rocketq_json("admin", "offset", "reset", "-g", GROUP, "-t", TOPIC, "--to-earliest", *ep)
        rows = reset["offset_table"]
        assert sorted(r["queue_id"] for r in rows) == [0, 1, 2, 3]
        assert all(r["after"] == 0 for r in rows) and sum(r["before"] for r in rows) == COUNT
        # both consumers drop and reload their queues from offset 0: every message comes again
        await wait_until(lambda: set(first.keys) | set(second.keys) == set(keys), 20, "consumed again")
        assert first.keys and second.keys, "both consumers consumed from the new offsets"
        await wait_until(committed_everything(broker), 10, "offsets committed again")

        one_queue = await rocketq("admin", "offset", "reset", "-g", GROUP, "-t", TOPIC, "--queue", "0",
                                  "--offset", "1", *ep)
        assert one_queue.exit_code == 0, one_queue.output
        assert "before" in one_queue.output and "after" in one_queue.output
        assert broker.offsets.query(GROUP, TOPIC, 0) in range(1, COUNT)
        usage = await rocketq("admin", "offset", "reset", "-g", GROUP, "-t", TOPIC, *ep)
        assert usage.exit_code == 2 and "exactly one" in usage.output
    finally:
        for c in consumers:
            await c.shutdown()


async def test_status_last_consume_follows_a_concurrent_consumer(broker: Broker, client_api: ClientAPI) -> None:
    """`consumer status`'s "last consume" is when the listener last finished a message of the queue,
    for concurrent consumers too (it stayed at the queue's creation)."""
    await client_api.create_topic(broker.address, "last-consume", queue_nums=1)
    collector = Collector()
    c = consumer(broker.address, "last-consume-g", "last-consume", collector)

    async def last_consume_at_ms() -> int:
        status = await rocketq_json("admin", "consumer", "status", "-g", "last-consume-g", "--endpoints",
                                    broker.address)
        return int(next(q for q in status["clients"][0]["mq_table"] if q["topic"] == "last-consume")[
            "last_consume_at_ms"])
    async with c:
        await wait_until(lambda: len(c.assigned_queues("last-consume")) == 1, 10, "queue assigned")
        created_at_ms = await last_consume_at_ms()
        sent_at_ms = int(time.time() * 1000)      # the status call above took several ms
        keys = await produce(broker.address, "last-consume", 3)
        await wait_until(lambda: set(collector.keys) == set(keys), 10, "consumed")
        # (±1 ms: the client converts its monotonic instants to epoch ms at each answer)
        assert await last_consume_at_ms() >= max(sent_at_ms - 1, created_at_ms + 2), (created_at_ms, sent_at_ms)
