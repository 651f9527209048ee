"""System topics are protected (RocketMQ `TopicValidator.isSystemTopic` / `isNotAllowedSendTopic`):
no client creates, changes or deletes them through the admin requests, nor sends to the ones only
the broker writes; the broker's own uses of them (delayed messages, retry topics) go on."""

from __future__ import annotations

import time

import msgpack
import pytest

from broker.broker import Broker
from client.admin_api import AdminAPI
from client.api import ClientAPI
from protocol.errors import NoPermission
from protocol.headers import SendBatchMessageRequestHeader
from protocol.model import PullStatus
from protocol.topics import SCHEDULE_TOPIC
from tests.helpers import pull_header, send

PROTECTED = [SCHEDULE_TOPIC, "TBW102", "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_anything",
             "OFFSET_MOVED_EVENT", "%RETRY%g", "%DLQ%g", "broker-a", "DefaultCluster"]


@pytest.mark.parametrize("topic", PROTECTED)
async def test_a_system_topic_cannot_be_created_or_deleted_by_a_client(
        broker: Broker, client_api: ClientAPI, topic: str) -> None:
    admin = AdminAPI(client_api.remoting)
    if topic.startswith("%RETRY%"):
        await send(client_api, broker.address, "orders", b"x")       # the broker makes %RETRY%g itself
        result = await client_api.pull_message(broker.address, pull_header(topic="orders"), 3_000)
        await client_api.consumer_send_msg_back(broker.address, result.messages[0], "g", 0, 16)
    before = broker.topics.get(topic)
    with pytest.raises(NoPermission, match="system topic"):
        await client_api.create_topic(broker.address, topic, queue_nums=1)
    with pytest.raises(NoPermission, match="system topic"):
        await admin.delete_topic(broker.address, topic)
    assert broker.topics.get(topic) == before
    if topic.startswith("%RETRY%"):
        assert before is not None and before.read_queue_nums == 1     # internal creation still works


@pytest.mark.parametrize("topic", [SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "SELF_TEST_TOPIC"])
async def test_sends_to_a_broker_only_topic_are_refused(broker: Broker, client_api: ClientAPI, topic: str) -> None:
    with pytest.raises(NoPermission, match="forbidden"):
        await send(client_api, broker.address, topic, b"x")
    header = SendBatchMessageRequestHeader(producer_group="pg", topic=topic, queue_id=0, born_timestamp=0)
    with pytest.raises(NoPermission, match="forbidden"):
        await client_api.send_batch(broker.address, header, msgpack.packb([[{}, 0, b"x"]]))
    assert broker.topics.get(topic) is None


async def test_delayed_messages_still_work_and_cannot_be_sent_back_before_delivery(
        broker: Broker, client_api: ClientAPI) -> None:
    with pytest.raises(NoPermission):
        await client_api.create_topic(broker.address, SCHEDULE_TOPIC, queue_nums=1)
    sent_at = time.monotonic()
    result = await send(client_api, broker.address, "later", b"delayed", properties={"DELAY": "2"})   # 200 ms
    scheduled = int(result.msg_id[16:], 16)
    fake = await client_api.view_message(broker.address, result.msg_id)
    with pytest.raises(NoPermission, match="system topic"):
        await client_api.consumer_send_msg_back(broker.address, fake, "g", 0, 16)
    pulled = await client_api.pull_message(broker.address, pull_header(topic="later", suspend_timeout_ms=3_000),
                                           5_000)
    assert pulled.status is PullStatus.FOUND and pulled.messages[0].body == b"delayed"
    assert pulled.messages[0].commit_log_offset != scheduled
    assert time.monotonic() - sent_at >= 0.15
