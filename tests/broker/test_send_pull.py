"""SEND_MESSAGE, SEND_BATCH_MESSAGE, PULL_MESSAGE and VIEW_MESSAGE_BY_ID against a real broker."""

from __future__ import annotations

import msgpack
import pytest

from broker.broker import Broker
from client.api import ClientAPI
from protocol.codes import Perm, PullSysFlag, RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import NoPermission, SystemError_
from protocol.headers import SendBatchMessageRequestHeader
from protocol.message import Message, encode_batch_body, parse_msg_id
from protocol.model import PullStatus
from tests.helpers import pull_header, send


async def test_send_then_pull_returns_the_message(broker: Broker, client_api: ClientAPI) -> None:
    sent = [await send(client_api, broker.address, "orders", f"m{i}".encode(), tags="A",
                       properties={"k": str(i)}) for i in range(3)]
    assert [r.queue_offset for r in sent] == [0, 1, 2]
    result = await client_api.pull_message(broker.address, pull_header(topic="orders"), timeout_ms=3_000)
    assert result.status is PullStatus.FOUND
    assert result.next_begin_offset == 3 and result.min_offset == 0 and result.max_offset == 3
    assert [m.body for m in result.messages] == [b"m0", b"m1", b"m2"]
    first = result.messages[0]
    assert first.msg_id == sent[0].msg_id and first.tags == "A" and first.properties["k"] == "0"
    assert first.queue_offset == 0 and first.topic == "orders"
    assert parse_msg_id(first.msg_id) == (broker.address, first.commit_log_offset)
    assert first.store_timestamp > 0 and first.born_host.startswith("127.0.0.1:")
    assert first.store_host == broker.address


async def test_batch_send_assigns_consecutive_offsets(broker: Broker, client_api: ClientAPI) -> None:
    messages = [Message("batch", f"b{i}".encode(), tags="T") for i in range(32)]
    header = SendBatchMessageRequestHeader(producer_group="pg", topic="batch", queue_id=1, born_timestamp=1)
    result = await client_api.send_batch(broker.address, header, encode_batch_body(messages))
    assert result.queue_offset == 0 and len(result.msg_ids) == 32 and len(set(result.msg_ids)) == 32
    again = await client_api.send_batch(broker.address, header, encode_batch_body(messages[:2]))
    assert again.queue_offset == 32
    pulled = await client_api.pull_message(broker.address, pull_header(topic="batch", queue_id=1), 3_000)
    assert [m.body for m in pulled.messages] == [f"b{i}".encode() for i in range(32)]
    assert [m.msg_id for m in pulled.messages] == list(result.msg_ids)


async def test_pull_respects_max_msg_nums_and_the_32_message_cap(broker: Broker, client_api: ClientAPI) -> None:
    for i in range(40):
        await send(client_api, broker.address, "cap", str(i).encode())
    five = await client_api.pull_message(broker.address, pull_header(topic="cap", max_msg_nums=5), 3_000)
    assert len(five.messages) == 5 and five.next_begin_offset == 5
    capped = await client_api.pull_message(broker.address, pull_header(topic="cap", max_msg_nums=1000), 3_000)
    assert len(capped.messages) == 32 and capped.next_begin_offset == 32
    clamped = await client_api.pull_message(broker.address, pull_header(topic="cap", max_msg_nums=0), 3_000)
    assert len(clamped.messages) == 1


async def test_view_message_by_id(broker: Broker, client_api: ClientAPI) -> None:
    sent = await send(client_api, broker.address, "view", b"hello", tags="v")
    message = await client_api.view_message(broker.address, sent.msg_id)
    assert message.body == b"hello" and message.msg_id == sent.msg_id and message.tags == "v"


async def test_commit_offset_flag_stores_the_offset(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "co", b"x")
    header = pull_header(topic="co", group="cg", commit_offset=1,
                         sys_flag=PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET)
    await client_api.pull_message(broker.address, header, 3_000)
    assert await client_api.query_consumer_offset(broker.address, "cg", "co", 0) == 1


def test_batch_body_is_msgpack_array() -> None:
    body = encode_batch_body([Message("t", b"x", tags="a", keys=["k1", "k2"])])
    assert msgpack.unpackb(body) == [[{"TAGS": "a", "KEYS": "k1 k2"}, 0, b"x"]]


async def test_a_topic_changed_after_sends_is_checked_again(broker: Broker, client_api: ClientAPI) -> None:
    """The one-message send path remembers checked (topic, queue, group) sends; any topic change
    must make the next send go through the checks again."""
    for queue_id in (0, 3):
        await send(client_api, broker.address, "changing", b"ok", queue_id=queue_id)   # checked, remembered
    await client_api.create_topic(broker.address, "changing", queue_nums=2)          # shrunk to 2 queues
    with pytest.raises(SystemError_, match="queue_id 3"):
        await send(client_api, broker.address, "changing", b"no", queue_id=3)
    await send(client_api, broker.address, "changing", b"ok", queue_id=1)
    await client_api.create_topic(broker.address, "changing", queue_nums=2, perm=Perm.READ)   # read-only
    with pytest.raises(NoPermission):
        await send(client_api, broker.address, "changing", b"no", queue_id=0)
    pulled = await client_api.pull_message(broker.address, pull_header(topic="changing"), 3_000)
    assert [m.body for m in pulled.messages] == [b"ok"]


async def test_a_topic_changed_after_batches_is_checked_again(broker: Broker, client_api: ClientAPI) -> None:
    """Batches share the checked-send cache of the one-message path: a topic change after batches
    makes the next batch go through the checks again."""
    def batch_to(queue_id: int) -> SendBatchMessageRequestHeader:
        return SendBatchMessageRequestHeader(producer_group="pg", topic="changing-b", queue_id=queue_id)
    body = encode_batch_body([Message("changing-b", b"ok")] * 2)
    for queue_id in (0, 3):
        await client_api.send_batch(broker.address, batch_to(queue_id), body)          # checked, remembered
    await client_api.create_topic(broker.address, "changing-b", queue_nums=2)
    with pytest.raises(SystemError_, match="queue_id 3"):
        await client_api.send_batch(broker.address, batch_to(3), body)
    await client_api.create_topic(broker.address, "changing-b", queue_nums=2, perm=Perm.READ)
    with pytest.raises(NoPermission):
        await client_api.send_batch(broker.address, batch_to(0), body)
    assert await client_api.get_max_offset(broker.address, "changing-b", 0) == 2


async def test_a_mistyped_batch_field_takes_the_checked_path(broker: Broker, client_api: ClientAPI) -> None:
    body = encode_batch_body([Message("typed-b", b"x")])
    header = SendBatchMessageRequestHeader(producer_group="pg", topic="typed-b", queue_id=0)
    await client_api.send_batch(broker.address, header, body)
    for fields in ({**header.to_fields(), "queue_id": "0"}, {**header.to_fields(), "born_timestamp": 1.5},
                   {"producer_group": "pg", "queue_id": 0}):
        response = await client_api.remoting.invoke(
            broker.address, request(RequestCode.SEND_BATCH_MESSAGE, fields, body), 3_000)
        assert response.code != ResponseCode.SUCCESS, fields
    system = await client_api.remoting.invoke(broker.address, request(
        RequestCode.SEND_BATCH_MESSAGE, {**header.to_fields(), "topic": "%RETRY%g"}, body), 3_000)
    assert system.code == ResponseCode.NO_PERMISSION
    assert await client_api.get_max_offset(broker.address, "typed-b", 0) == 1


async def test_a_mistyped_send_field_takes_the_checked_path(broker: Broker, client_api: ClientAPI) -> None:
    """A field of an unexpected type is answered by the typed header's error, not stored."""
    await send(client_api, broker.address, "typed", b"first")
    cmd = request(RequestCode.SEND_MESSAGE, {"producer_group": "pg", "topic": "typed", "queue_id": "0",
                                             "properties": {}})
    response = await client_api.remoting.invoke(broker.address, cmd, 3_000)
    assert response.code != ResponseCode.SUCCESS
    assert await client_api.get_max_offset(broker.address, "typed", 0) == 1
