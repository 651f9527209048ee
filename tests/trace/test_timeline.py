"""The message trace end to end on one broker: real producers and consumers over TCP, the trace
read back with QUERY_MESSAGE_TRACE (`admin.trace.gather_trace`) and `rocketq admin message trace`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.broker import Broker
from client import ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from client.admin_api import AdminAPI
from conf.client import ClientConfig
from tests.admin.cli_runner import rocketq, rocketq_json
from tests.conftest import broker_config
from tests.trace.helpers import events, trace_until

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
FAST_CLIENT = ClientConfig(persist_offset_interval_ms=100)


def consumer(address: str, group: str, topic: str, listener: object, **options: object) -> PushConsumer:
    made = PushConsumer(group, address, consume_from_where="CONSUME_FROM_FIRST_OFFSET", client_config=FAST_CLIENT,
                        **options)  # type: ignore[arg-type]
    made.subscribe(topic)
    made.register_listener(listener)  # type: ignore[arg-type]
    return made


async def send(address: str, topic: str, body: bytes, keys: str = "") -> tuple[str, str]:
    """(UNIQ_KEY, offset msg id) of one message sent by a real producer."""
    async with Producer("trace-producers", address) as producer:
        message = Message(topic, body)
        if keys:
            message.keys = keys
        result = await producer.send(message)
        return result.uniq_keys[0], result.msg_id


async def test_a_message_consumed_once(broker: Broker, admin_api: AdminAPI) -> None:
    await admin_api.create_topic(broker.address, "orders", queue_nums=1)
    received: list[MessageExt] = []

    def listener(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
        received.extend(msgs)
        return OK
    async with consumer(broker.address, "billing", "orders", listener) as push:
        uniq, offset_id = await send(broker.address, "orders", b"one", keys="order-1")
        timeline = await trace_until(admin_api, broker.address, lambda t: "consumed" in events(t), msg_id=uniq)
        client_id = push.client_id
    assert events(timeline) == ["sent", "stored", "delivered", "consumed"]
    sent, stored, delivered, consumed = timeline
    assert sent["group"] == "trace-producers" and sent["client_addr"]
    assert stored["topic"] == "orders" and stored["queue_id"] == 0 and stored["queue_offset"] == 0
    assert stored["msg_id"] == offset_id and stored["uniq_key"] == uniq and stored["broker"] == broker.address
    assert delivered["group"] == consumed["group"] == "billing" and delivered["client_id"] == client_id
    assert sent["at_ms"] <= delivered["at_ms"] <= consumed["at_ms"]
    by_offset_id = await admin_api.query_message_trace(broker.address, msg_id=offset_id)
    assert [e["event"] for e in by_offset_id] == ["sent", "stored", "delivered", "consumed"]
    by_key = await rocketq_json("admin", "message", "trace", "--key", "order-1", "--topic", "orders",
                                "-n", broker.address)
    assert [e["event"] for e in by_key] == ["sent", "stored", "delivered", "consumed"]
    printed = await rocketq("admin", "message", "trace", "--msg-id", uniq, "-n", broker.address)
    assert printed.exit_code == 0, printed.output
    for word in ("sent", "stored", "delivered", "consumed", "billing", "orders:0@0"):
        assert word in printed.output
    other_topic = await admin_api.query_message_trace(broker.address, key="order-1", topic="elsewhere")
    assert other_topic == []


async def test_a_message_retried_twice_then_consumed(broker: Broker, admin_api: AdminAPI) -> None:
    await admin_api.create_topic(broker.address, "orders", queue_nums=1)
    calls: list[int] = []

    def listener(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
        calls.append(msgs[0].reconsume_times)
        return LATER if len(calls) <= 2 else OK
    async with consumer(broker.address, "flaky", "orders", listener):
        uniq, _ = await send(broker.address, "orders", b"twice")
        timeline = await trace_until(admin_api, broker.address,
                                     lambda t: events(t, topic="%RETRY%flaky").count("consumed") == 1
                                     and events(t).count("retry_stored") == 2, msg_id=uniq)
    assert calls == [0, 1, 2]
    assert events(timeline, topic="orders") == ["sent", "stored", "delivered"], "its outcome: sent back"
    assert events(timeline).count("sent_back") == 2
    retry = [e for e in timeline if e.get("topic") == "%RETRY%flaky"]
    assert [e["event"] for e in retry] == ["retry_stored", "delivered", "retry_stored", "delivered", "consumed"]
    assert all(e["uniq_key"] == uniq for e in timeline)
    assert not [e for e in timeline if e.get("topic", "").startswith("SCHEDULE")], "the delayed copies are not shown"
    names = events(timeline)
    assert names.index("sent_back") < names.index("retry_stored"), "sent back, then stored by the schedule"


async def test_a_message_sent_to_the_dlq_then_resent(broker: Broker, admin_api: AdminAPI) -> None:
    await admin_api.create_topic(broker.address, "orders", queue_nums=1)
    async with consumer(broker.address, "doomed", "orders", lambda msgs, ctx: LATER, max_reconsume_times=0):
        uniq, _ = await send(broker.address, "orders", b"poison")
        await trace_until(admin_api, broker.address, lambda t: "to_dlq" in events(t), msg_id=uniq)
    resent = await rocketq_json("admin", "dlq", "resend", "-g", "doomed", "--all", "-n", broker.address)
    assert len(resent) == 1
    timeline = await trace_until(admin_api, broker.address, lambda t: "resent_from_dlq" in events(t), msg_id=uniq)
    # (the copy may be delivered too: a pull the stopped consumer left held is answered with it)
    assert events(timeline)[:7] == ["sent", "stored", "delivered", "sent_back", "to_dlq", "resent_from_dlq",
                                    "stored"], [(e["event"], e.get("group"), e.get("topic")) for e in timeline]
    assert "consumed" not in events(timeline), "sent back, then resent: the DLQ's resend mark is no consumption"
    dlq = next(e for e in timeline if e["event"] == "to_dlq")
    assert dlq["topic"] == "%DLQ%doomed" and dlq["group"] == "doomed"
    copy = timeline[6]
    assert copy["msg_id"] == resent[0]["new_msg_id"] and copy["topic"] == "orders" and copy["uniq_key"] == uniq


async def test_the_trace_survives_a_broker_restart(tmp_path: Path, admin_api: AdminAPI) -> None:
    config = broker_config(tmp_path)
    async with Broker(config) as first:
        uniq, _ = await send(first.address, "orders", b"kept")
        before = await trace_until(admin_api, first.address, lambda t: "stored" in events(t), msg_id=uniq)
    async with Broker(config) as second:
        after = await admin_api.query_message_trace(second.address, msg_id=uniq)
    assert [e["event"] for e in after] == ["sent", "stored"] and after[0]["at_ms"] == before[0]["at_ms"]


async def test_nothing_is_recorded_with_the_trace_off(tmp_path: Path, admin_api: AdminAPI) -> None:
    from conf.trace import TraceConfig
    async with Broker(broker_config(tmp_path, trace=TraceConfig(enabled=False))) as broker:
        uniq, offset_id = await send(broker.address, "orders", b"untraced")
        for wanted in (uniq, offset_id):        # the store still knows where it is
            found = await admin_api.query_message_trace(broker.address, msg_id=wanted)
            assert [(e["event"], e["msg_id"]) for e in found] == [("stored", offset_id)]
        assert not (tmp_path / "store" / "trace").exists()
    await asyncio.sleep(0)


async def test_a_message_sent_in_a_batch_and_consumed(broker: Broker, admin_api: AdminAPI) -> None:
    """A batch is recorded once (not per message); each of its messages is found through the
    store's key index and gets its "sent" from the batch's record."""
    await admin_api.create_topic(broker.address, "orders", queue_nums=1)
    async with Producer("batchers", broker.address) as producer:
        messages = [Message("orders", f"m{i}".encode()) for i in range(3)]
        for i, message in enumerate(messages):
            message.keys = f"batched-{i}"
        result = await producer.send_batch(messages)
    async with consumer(broker.address, "billing", "orders", lambda msgs, ctx: OK):
        timeline = await trace_until(admin_api, broker.address, lambda t: "consumed" in events(t), key="batched-1")
    assert events(timeline) == ["sent", "stored", "delivered", "consumed"]
    sent = timeline[0]
    assert sent["group"] == "batchers" and "in a batch of 3" in sent["detail"] and sent["queue_offset"] == 1
    assert timeline[1]["msg_id"] == result.msg_ids[1] and timeline[1]["uniq_key"] == result.uniq_keys[1]


async def test_usual_single_sends_are_traced_by_id_and_key(tmp_path: Path, admin_api: AdminAPI) -> None:
    """After the first send to a queue (the typed path, a SENT record of its own), a producer's
    sends take the usual fast path, recorded as one SENT_SET per client and queue: each message
    is still found by UNIQ_KEY, offset msg id and key, with its producer group and address; with
    the key index off, by its offset msg id."""
    from conf.store import StoreConfig
    for key_index in (True, False):
        store = StoreConfig(path=tmp_path / f"store-{key_index}", commit_log_segment_bytes=1 << 20,
                            key_index_max_entries=100_000 if key_index else 0)
        async with Broker(broker_config(tmp_path, store=store)) as broker:
            await admin_api.create_topic(broker.address, "orders", queue_nums=1)
            async with Producer("usual-producers", broker.address) as producer:
                sent = [await producer.send(Message("orders", b"m%d" % i, keys=f"usual-{i}")) for i in range(5)]
            for i, result in enumerate(sent):
                wanted = [result.msg_id] + ([result.uniq_keys[0]] if key_index else [])
                for msg_id in wanted:
                    found = await trace_until(admin_api, broker.address, lambda t: "stored" in events(t),
                                              msg_id=msg_id)
                    assert events(found) == ["sent", "stored"], (i, msg_id, found)
                    assert found[0]["group"] == "usual-producers" and found[0]["client_addr"]
                    assert found[1]["queue_offset"] == i and found[1]["msg_id"] == result.msg_id
                if key_index:
                    by_key = await admin_api.query_message_trace(broker.address, key=f"usual-{i}")
                    assert [(e["event"], e["msg_id"]) for e in by_key] == [("sent", result.msg_id),
                                                                           ("stored", result.msg_id)]
