"""Issue 35, items 3 and 4: a message's properties count towards its size limits (RocketMQ's
32,767-byte properties string), and every header integer is range-checked at decode: a send out
of range is MESSAGE_ILLEGAL (13), on every request, naming the range, never an internal error, and
nothing refused is stored or moves an offset."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from broker.broker import Broker
from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, MessageExt, PushConsumer
from client.api import ClientAPI
from conf.client import ClientConfig
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import MessageIllegal
from protocol.headers import SendMessageRequestHeader
from protocol.message import properties_bytes
from tests.helpers import send, wait_until

U64_MAX = 2**64 - 1
MIB = 1024 * 1024


def sized_properties(size: int) -> dict[str, str]:
    """Properties whose RocketMQ string is exactly `size` bytes (one "p" entry: 1 + 2 + value)."""
    return {"p": "v" * (size - 3)}


async def invoke(api: ClientAPI, address: str, code: int, ext: dict[str, Any], body: bytes = b"") -> RemotingCommand:
    return await api.remoting.invoke(address, request(code, ext, body), 3_000)


async def test_properties_over_their_limit_or_the_message_limit_are_refused(
        broker: Broker, client_api: ClientAPI) -> None:
    def header(properties: dict[str, str]) -> SendMessageRequestHeader:
        return SendMessageRequestHeader(producer_group="pg", topic="props", queue_id=0, properties=properties)

    at_limit = sized_properties(32_767)
    assert properties_bytes(at_limit) == 32_767
    assert (await client_api.send_message(broker.address, header(at_limit), b"x")).queue_offset == 0
    with pytest.raises(MessageIllegal, match="properties of 32768 bytes exceed max_properties_bytes 32767"):
        await client_api.send_message(broker.address, header(sized_properties(32_768)), b"x")
    many = {f"k{i:07d}": "v" * 100 for i in range(MIB // 110)}          # a 1 MiB map of short entries
    with pytest.raises(MessageIllegal, match="max_properties_bytes"):
        await client_api.send_message(broker.address, header(many), b"x")
    wide = {"é": "日本" * 6_000}                    # 12,001 characters, 36,004 UTF-8 bytes as a string
    with pytest.raises(MessageIllegal, match="properties of 36004 bytes"):
        await client_api.send_message(broker.address, header(wide), b"x")
    body = bytes(4 * MIB - 100)                     # within max_message_bytes alone, not with properties
    with pytest.raises(MessageIllegal, match=r"body 4194204 \+ properties 200\) exceeds max_message_bytes"):
        await client_api.send_message(broker.address, header(sized_properties(200)), body)
    items = [[{}, 0, b"ok"], [sized_properties(40_000), 0, b"big"]]
    response = await invoke(client_api, broker.address, RequestCode.SEND_BATCH_MESSAGE,
                            {"producer_group": "pg", "topic": "props", "queue_id": 0},
                            msgpack.packb(items, use_bin_type=True))
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "batch message 1 properties of 40000 bytes exceed max_properties_bytes" in (response.remark or "")
    assert await client_api.get_max_offset(broker.address, "props", 0) == 1      # only the first send


async def test_a_send_back_of_a_message_with_properties_over_the_limit_is_refused(
        broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "old")
    store = broker.store
    assert store is not None
    # as a broker without the limit stored it
    put = store.put_message(topic="old", queue_id=0, body=b"x", properties=sized_properties(50_000), flag=0,
                            born_timestamp=1, born_host="127.0.0.1:1")
    response = await invoke(client_api, broker.address, RequestCode.CONSUMER_SEND_MSG_BACK,
                            {"commit_log_offset": put.commit_log_offsets[0], "group": "g", "delay_level": 0})
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "properties of 50000 bytes, over max_properties_bytes 32767" in (response.remark or "")


@pytest.mark.parametrize(("code", "ext", "expected", "field"), [
    (RequestCode.SEND_MESSAGE, {"reconsume_times": U64_MAX}, ResponseCode.MESSAGE_ILLEGAL, "reconsume_times"),
    (RequestCode.SEND_MESSAGE, {"reconsume_times": -1}, ResponseCode.MESSAGE_ILLEGAL, "reconsume_times"),
    (RequestCode.SEND_MESSAGE, {"flag": 2**31}, ResponseCode.MESSAGE_ILLEGAL, "flag"),
    (RequestCode.SEND_MESSAGE, {"born_timestamp": U64_MAX}, ResponseCode.MESSAGE_ILLEGAL, "born_timestamp"),
    (RequestCode.SEND_MESSAGE, {"max_reconsume_times": U64_MAX}, ResponseCode.MESSAGE_ILLEGAL, "max_reconsume_times"),
    (RequestCode.SEND_MESSAGE, {"queue_id": 1024}, ResponseCode.MESSAGE_ILLEGAL, "queue_id"),
    (RequestCode.SEND_BATCH_MESSAGE, {"born_timestamp": -1}, ResponseCode.MESSAGE_ILLEGAL, "born_timestamp"),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"delay_level": U64_MAX}, ResponseCode.MESSAGE_ILLEGAL, "delay_level"),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"max_reconsume_times": 2**31}, ResponseCode.MESSAGE_ILLEGAL,
     "max_reconsume_times"),
    (RequestCode.PULL_MESSAGE, {"queue_offset": U64_MAX}, ResponseCode.MESSAGE_ILLEGAL, "queue_offset"),
    (RequestCode.PULL_MESSAGE, {"commit_offset": U64_MAX}, ResponseCode.MESSAGE_ILLEGAL, "commit_offset"),
    (RequestCode.PULL_MESSAGE, {"suspend_timeout_ms": 2**63}, ResponseCode.MESSAGE_ILLEGAL, "suspend_timeout_ms"),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"commit_offset": U64_MAX}, ResponseCode.MESSAGE_ILLEGAL, "commit_offset"),
])
async def test_out_of_range_header_integers_are_refused_and_change_nothing(
        broker: Broker, client_api: ClientAPI, code: int, ext: dict[str, Any], expected: int, field: str) -> None:
    sent = await send(client_api, broker.address, "t")
    base: dict[int, dict[str, Any]] = {
        RequestCode.SEND_MESSAGE: {"producer_group": "pg", "topic": "t", "queue_id": 0, "properties": {}},
        RequestCode.SEND_BATCH_MESSAGE: {"producer_group": "pg", "topic": "t", "queue_id": 0},
        RequestCode.CONSUMER_SEND_MSG_BACK: {"commit_log_offset": int(sent.msg_id[16:], 16), "group": "g"},
        RequestCode.PULL_MESSAGE: {"consumer_group": "g", "topic": "t", "queue_id": 0, "queue_offset": 0,
                                   "max_msg_nums": 1, "sys_flag": 0x1 | 0x4, "commit_offset": 1,
                                   "suspend_timeout_ms": 0, "sub_version": 0, "subscription": "*"},
        RequestCode.UPDATE_CONSUMER_OFFSET: {"consumer_group": "g", "topic": "t", "queue_id": 0, "commit_offset": 1},
    }
    body = msgpack.packb([[{}, 0, b"x"]], use_bin_type=True) if code == RequestCode.SEND_BATCH_MESSAGE else b"x"
    response = await invoke(client_api, broker.address, code, {**base[code], **ext}, body)
    assert response.code == expected, response
    assert f"field '{field}' is {ext[field]}, outside its range" in (response.remark or "")
    assert await client_api.get_max_offset(broker.address, "t", 0) == 1          # nothing stored
    assert broker.offsets.query("g", "t", 0) is None                             # nothing committed


async def test_a_stored_reconsume_times_past_int32_sends_the_message_to_the_dlq_and_never_pins_its_group(
        broker: Broker, client_api: ClientAPI) -> None:
    """A message an older broker stored with reconsume_times 2**64 - 1: its send-back used to fail
    (OverflowError on reconsume_times + 1), so the consumer kept retrying it locally and the
    group's committed offset stayed at 0 for good."""
    await send(client_api, broker.address, "t", b"first")
    store = broker.store
    assert store is not None
    store.put_message(topic="t", queue_id=0, body=b"poison", properties={"UNIQ_KEY": "poison"}, flag=0,
                      born_timestamp=1, born_host="127.0.0.1:1", reconsume_times=U64_MAX)
    await send(client_api, broker.address, "t", b"last")
    bodies: list[bytes] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        bodies.append(msgs[0].body)
        return (ConsumeConcurrentlyStatus.RECONSUME_LATER if msgs[0].body == b"poison"
                else ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    consumer = PushConsumer("g", broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            client_config=ClientConfig(persist_offset_interval_ms=100))
    consumer.subscribe("t")
    consumer.register_listener(listener)
    async with consumer:
        await wait_until(lambda: broker.offsets.query("g", "t", 0) == 3, 10, "the group's offset past all three")
    assert bodies.count(b"poison") == 1
    assert await client_api.get_max_offset(broker.address, "%DLQ%g", 0) == 1
