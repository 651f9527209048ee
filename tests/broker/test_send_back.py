"""CONSUMER_SEND_MSG_BACK and the %RETRY% send rule against a real broker (REFERENCE.md §9)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.broker import Broker
from client.api import ClientAPI
from conf.store import StoreConfig
from protocol.codes import Perm, RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import FlushDiskTimeout, MessageIllegal, NoPermission, SystemError_
from protocol.headers import CreateSubscriptionGroupRequestHeader, SendMessageRequestHeader
from protocol.message import MessageExt
from protocol.model import PullStatus
from protocol.topics import SCHEDULE_TOPIC
from tests.broker.store.conftest import Disk
from tests.conftest import broker_config
from tests.helpers import pull_header, send

LEVEL_3_MS = 300          # tests/conftest.py TEST_DELAY_LEVELS: level N is N x 100 ms


async def pull_one(api: ClientAPI, broker: Broker, topic: str, queue_offset: int = 0,
                   timeout_ms: int = 3_000) -> MessageExt:
    """The message at `queue_offset` of `topic` queue 0, waiting (long polling) up to `timeout_ms`."""
    result = await api.pull_message(broker.address, pull_header(topic=topic, queue_offset=queue_offset,
                                                                suspend_timeout_ms=timeout_ms, max_msg_nums=1),
                                    timeout_ms + 2_000)
    assert result.status is PullStatus.FOUND, result
    return result.messages[0]


async def original(api: ClientAPI, broker: Broker) -> MessageExt:
    await send(api, broker.address, "orders", b"body", tags="paid", properties={"KEYS": "k1", "amount": "7"})
    return await pull_one(api, broker, "orders")


async def test_a_sent_back_message_returns_through_the_retry_topic_after_its_delay(
        broker: Broker, client_api: ClientAPI) -> None:
    message = await original(client_api, broker)
    sent_at = time.monotonic()
    await client_api.consumer_send_msg_back(broker.address, message, "g", 0, 16)
    route = await client_api.get_route_info(broker.address, "%RETRY%g")
    assert [q.read_queue_nums for q in route.queue_datas] == [1]          # the group's retry_queue_nums
    retried = await pull_one(client_api, broker, "%RETRY%g")
    waited_ms = (time.monotonic() - sent_at) * 1000
    assert LEVEL_3_MS * 0.8 <= waited_ms <= LEVEL_3_MS + 500, waited_ms    # level 3 + reconsume_times 0
    assert retried.body == b"body" and retried.reconsume_times == 1
    assert retried.born_timestamp == message.born_timestamp and retried.flag == message.flag
    props = retried.properties
    assert (props["TAGS"], props["KEYS"], props["amount"]) == ("paid", "k1", "7")
    assert props["RETRY_TOPIC"] == "orders" and props["ORIGIN_MESSAGE_ID"] == message.msg_id
    assert props["REAL_TOPIC"] == "%RETRY%g" and "DELAY" not in props

    # The second failure keeps the first origin id and the original topic, and waits level 4.
    await client_api.consumer_send_msg_back(broker.address, retried, "g", 0, 16)
    again = await pull_one(client_api, broker, "%RETRY%g", queue_offset=1)
    assert again.reconsume_times == 2
    assert again.properties["ORIGIN_MESSAGE_ID"] == message.msg_id
    assert again.properties["RETRY_TOPIC"] == "orders"


async def test_past_the_maximum_a_message_goes_to_the_dlq(broker: Broker, client_api: ClientAPI) -> None:
    message = await original(client_api, broker)
    message.reconsume_times = 0
    await client_api.consumer_send_msg_back(broker.address, message, "g", 0, max_reconsume_times=0)
    dead = await pull_one(client_api, broker, "%DLQ%g", timeout_ms=1_000)
    assert dead.body == b"body" and dead.reconsume_times == 1
    assert dead.properties["ORIGIN_MESSAGE_ID"] == message.msg_id
    assert dead.properties["RETRY_TOPIC"] == "orders" and "DELAY" not in dead.properties
    assert dead.properties["DLQ_REASON"] == "failed 1 time (max reconsume times 0)"
    config = broker.topics.get("%DLQ%g")
    assert config is not None and (config.read_queue_nums, config.perm) == (1, Perm.READ | Perm.WRITE)
    assert _dlq_count(broker, "g") == 1


async def test_a_negative_delay_level_goes_straight_to_the_dlq(broker: Broker, client_api: ClientAPI) -> None:
    message = await original(client_api, broker)
    await client_api.consumer_send_msg_back(broker.address, message, "g", -1, 16)
    dead = await pull_one(client_api, broker, "%DLQ%g", timeout_ms=1_000)
    assert dead.body == b"body"
    assert dead.properties["DLQ_REASON"] == "the consumer sent it to the DLQ (delay level -1)"


async def test_the_groups_retry_max_times_applies_when_the_request_has_none(
        broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_subscription_group(broker.address, CreateSubscriptionGroupRequestHeader(
        group_name="g1", retry_max_times=0))
    message = await original(client_api, broker)
    await client_api.consumer_send_msg_back(broker.address, message, "g1", 0, max_reconsume_times=-1)
    assert (await pull_one(client_api, broker, "%DLQ%g1", timeout_ms=1_000)).body == b"body"


async def test_a_durable_send_back_waits_for_its_fsync_and_times_out_on_a_slow_disk(
        tmp_path: Path, client_api: ClientAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    """SYNC_FLUSH (the default): the copy is acknowledged once its group commit is done, and
    FLUSH_DISK_TIMEOUT past `sync_flush_timeout_ms`, as a SEND is (the same inline answer)."""
    config = broker_config(tmp_path)
    config = dataclasses.replace(config, store=dataclasses.replace(config.store, sync_flush_timeout_ms=100))
    async with Broker(config) as broker:
        assert broker.store is not None and config.store.flush_disk_type == "SYNC_FLUSH"
        message = await original(client_api, broker)
        await client_api.consumer_send_msg_back(broker.address, message, "g", 0, 16)
        assert broker.store.is_durable(broker.store.commit_log_max_offset())
        disk = Disk(broker.store, monkeypatch)
        disk.slow(1_000)
        try:
            with pytest.raises(FlushDiskTimeout):
                await client_api.consumer_send_msg_back(broker.address, message, "g", 0, 16)
        finally:
            disk.heal()


async def test_send_back_of_an_unknown_offset_is_a_clear_error(broker: Broker, client_api: ClientAPI) -> None:
    message = await original(client_api, broker)
    message.commit_log_offset += 3           # no record starts there
    with pytest.raises(SystemError_, match="no message starts at commit_log_offset"):
        await client_api.consumer_send_msg_back(broker.address, message, "g", 0, 16)
    message.commit_log_offset = -1
    with pytest.raises(MessageIllegal, match=r"'commit_log_offset' is -1, outside its range 0\.\."):
        await client_api.consumer_send_msg_back(broker.address, message, "g", 0, 16)


@pytest.mark.parametrize(("fields", "remark"), [
    ({"delay_level": "3"}, "delay_level"),
    ({"delay_level": True}, "delay_level"),
    ({"origin_msg_id": 7}, "origin_msg_id"),
    ({"origin_topic": 7}, "origin_topic"),
    ({"max_reconsume_times": 1.5}, "max_reconsume_times"),
    ({"commit_log_offset": "0"}, "commit_log_offset"),
    ({"group": "bad group!"}, "group"),
    ({"group": None}, "group"),
])
async def test_a_mistyped_send_back_of_a_known_group_gets_the_typed_error(
        broker: Broker, client_api: ClientAPI, fields: dict[str, object], remark: str) -> None:
    """The usual request reads its fields directly once its group passed the checks; anything else
    still gets the typed header's error, and nothing is stored."""
    message = await original(client_api, broker)
    await client_api.consumer_send_msg_back(broker.address, message, "g", 0, 16)   # "g" is now known
    assert broker.store is not None
    stored = broker.store.commit_log_max_offset()
    cmd = request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "commit_log_offset": message.commit_log_offset, "group": "g", "delay_level": 0,
        "origin_msg_id": message.msg_id, "origin_topic": "orders", "max_reconsume_times": 16, **fields})
    response = await client_api.remoting.invoke(broker.address, cmd, 3_000)
    assert response.code == ResponseCode.SYSTEM_ERROR and remark in (response.remark or ""), response
    assert broker.store.commit_log_max_offset() == stored


async def test_a_retry_send_at_the_maximum_goes_to_the_dlq(broker: Broker, client_api: ClientAPI) -> None:
    """The client's fallback path: a plain send to %RETRY%<group> with reconsume_times >= max."""
    async def retry_send(reconsume_times: int, body: bytes) -> None:
        header = SendMessageRequestHeader(producer_group="CLIENT_INNER_PRODUCER", topic="%RETRY%g", queue_id=0,
                                          properties={"DELAY": "1", "RETRY_TOPIC": "orders"},
                                          reconsume_times=reconsume_times, max_reconsume_times=3)
        await client_api.send_message(broker.address, header, body)
    await retry_send(2, b"still-retrying")
    await retry_send(3, b"dead")
    dead = await pull_one(client_api, broker, "%DLQ%g", timeout_ms=1_000)
    assert dead.body == b"dead" and "DELAY" not in dead.properties and dead.reconsume_times == 3
    assert dead.properties["DLQ_REASON"] == "failed 4 times (max reconsume times 3)"
    assert (await pull_one(client_api, broker, "%RETRY%g")).body == b"still-retrying"
    assert _dlq_count(broker, "g") == 1


async def test_a_delayed_send_is_held_in_the_schedule_topic_until_due(broker: Broker, client_api: ClientAPI) -> None:
    sent_at = time.monotonic()
    await send(client_api, broker.address, "later", b"x", properties={"DELAY": "5"})    # 500 ms
    assert broker.store is not None
    assert broker.store.get_max_offset(SCHEDULE_TOPIC, 4) == 1
    assert broker.store.get_max_offset("later", 0) == 0
    assert _sample(broker, "rocketq_schedule_backlog_messages", "delay_level", "5") == 1
    delivered = await pull_one(client_api, broker, "later", timeout_ms=3_000)
    assert (time.monotonic() - sent_at) * 1000 >= 500 - 5     # store clock ms rounding
    assert delivered.properties["REAL_TOPIC"] == "later" and delivered.properties["REAL_QID"] == "0"
    assert "DELAY" not in delivered.properties


@pytest.mark.parametrize(("delay", "error"), [("soon", MessageIllegal)])
async def test_a_bad_delay_level_is_refused(broker: Broker, client_api: ClientAPI, delay: str,
                                            error: type[Exception]) -> None:
    with pytest.raises(error, match="DELAY must be an integer"):
        await send(client_api, broker.address, "later", b"x", properties={"DELAY": delay})


async def test_the_schedule_topic_cannot_be_sent_to(broker: Broker, client_api: ClientAPI) -> None:
    with pytest.raises(NoPermission, match="system topic"):
        await send(client_api, broker.address, SCHEDULE_TOPIC, b"x")


async def test_levels_above_the_maximum_are_clamped(tmp_path: Path, client_api: ClientAPI) -> None:
    store = StoreConfig(path=tmp_path / "store", message_delay_level="100ms 200ms",
                        commit_log_segment_bytes=1024 * 1024)
    async with Broker(broker_config(tmp_path, store=store)) as broker:
        await send(client_api, broker.address, "later", b"x", properties={"DELAY": "99"})
        assert broker.store is not None and broker.store.get_max_offset(SCHEDULE_TOPIC, 1) == 1
        assert (await pull_one(client_api, broker, "later")).body == b"x"


def _dlq_count(broker: Broker, group: str) -> float:
    return _sample(broker, "rocketmq_send_to_dlq_messages_total", "consumer_group", group)


def _sample(broker: Broker, name: str, label: str, value: str) -> float:
    """The value of metric sample `name` whose `label` is `value` in the broker's exposition."""
    exposition = generate_latest(broker.metrics.registry).decode()
    return sum(sample.value for family in text_string_to_metric_families(exposition)
               for sample in family.samples if sample.name == name and sample.labels.get(label) == value)


@pytest.mark.parametrize("stored", [2**31 - 1, 2**64 - 1])
@pytest.mark.parametrize("max_reconsume_times", [2**31 - 1, -1])      # int32: the header's range
async def test_a_send_back_at_the_reconsume_times_bound_goes_to_the_dlq_and_never_fails(
        broker: Broker, client_api: ClientAPI, stored: int, max_reconsume_times: int) -> None:
    """A stored reconsume_times whose + 1 leaves int32 (or msgpack's range) is answered SUCCESS and
    dead-lettered with the bound, never an OverflowError (which pinned the group's offset)."""
    store = broker.store
    assert store is not None
    put = store.put_message(topic="orders", queue_id=0, body=b"worn", properties={}, flag=0,
                            born_timestamp=0, born_host="127.0.0.1:1", reconsume_times=stored)
    cmd = request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "commit_log_offset": put.commit_log_offsets[0], "group": "g", "delay_level": 0,
        "origin_msg_id": "", "origin_topic": "orders", "max_reconsume_times": max_reconsume_times})
    response = await client_api.remoting.invoke(broker.address, cmd, 3_000)
    assert response.code == ResponseCode.SUCCESS, response.remark
    dead = await pull_one(client_api, broker, "%DLQ%g", timeout_ms=1_000)
    assert dead.body == b"worn" and dead.reconsume_times == 2**31 - 1
    assert dead.properties["DLQ_REASON"].startswith("failed 2147483648 times")
