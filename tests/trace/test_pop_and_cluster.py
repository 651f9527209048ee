"""The trace of POP consumption (a message popped, not acknowledged, revived, popped again and
acknowledged) and of a message whose copies live on two brokers, asked through a name server."""

from __future__ import annotations

from pathlib import Path

from broker.broker import Broker
from client import SimpleConsumer
from client.admin_api import AdminAPI
from client.producer.producer import Producer
from protocol.message import Message
from tests.admin.cli_runner import rocketq_json
from tests.conftest import broker_config
from tests.helpers import send
from tests.namesrv.test_namesrv import cluster, wait_route
from tests.trace.helpers import events, trace_until


async def test_a_popped_message_not_acked_is_revived_then_acked(tmp_path: Path, admin_api: AdminAPI) -> None:
    async with Broker(broker_config(tmp_path, pop_revive_interval_ms=20)) as broker:
        await admin_api.create_topic(broker.address, "orders", 1)
        async with Producer("pg", broker.address) as producer:
            uniq = (await producer.send(Message("orders", b"pop me"))).uniq_keys[0]
        async with SimpleConsumer("popper", broker.address, subscriptions={"orders": "*"},
                                  await_duration_s=2.0) as simple:
            (first,) = await simple.receive(1, 0.2)         # never acknowledged: revived after 200 ms
            (again,) = await simple.receive(1, 30)
            assert again.message_id == first.message_id == uniq
            await simple.ack(again)
        timeline = await trace_until(admin_api, broker.address, lambda t: "acked" in events(t), msg_id=uniq)
    assert events(timeline) == ["sent", "stored", "popped", "revived", "popped", "acked"]
    assert all(e["group"] == "popper" for e in timeline[2:]) and timeline[2]["topic"] == "orders"
    assert "invisible until" in timeline[2]["detail"]


async def test_a_trace_over_a_name_server_joins_the_copies_on_both_brokers(tmp_path: Path,
                                                                          admin_api: AdminAPI) -> None:
    async with cluster(tmp_path, ["broker-a", "broker-b"]) as (ns, (a, b)):
        for broker in (a, b):
            await admin_api.create_topic(broker.address, "orders", queue_nums=1)
        await wait_route(admin_api, ns.address, "orders", ["broker-a", "broker-b"])
        uniq = "C0A8000100002A9F0000000000000042"   # a producer's failover: the same UNIQ_KEY on each broker
        first = await send(admin_api, a.address, "orders", b"x", properties={"UNIQ_KEY": uniq, "KEYS": "k-42"})
        second = await send(admin_api, b.address, "orders", b"x", properties={"UNIQ_KEY": uniq, "KEYS": "k-42"})
        timeline = await trace_until(admin_api, ns.address, lambda t: len(events(t)) == 4, msg_id=first.msg_id)
        assert [(e["event"], e["broker_name"]) for e in timeline] == [
            ("sent", "broker-a"), ("stored", "broker-a"), ("sent", "broker-b"), ("stored", "broker-b")]
        assert timeline[3]["msg_id"] == second.msg_id and {e["uniq_key"] for e in timeline} == {uniq}
        by_key = await rocketq_json("admin", "message", "trace", "--key", "k-42", "-n", ns.address)
        assert [(e["event"], e["broker"]) for e in by_key] == [(e["event"], e["broker"]) for e in timeline]
        on_b = await admin_api.query_message_trace(b.address, msg_id=first.msg_id)
        assert on_b == [], "broker-b alone knows nothing of broker-a's offset msg id"
