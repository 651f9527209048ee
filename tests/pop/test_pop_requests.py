"""POP wire requests from a hostile or careless client: out-of-range and mistyped fields, forged
or mismatched receipt handles, unknown topics, SQL92; NOTIFICATION held and woken. Each refusal
names what was wrong."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from client.pop_api import PopAPI
from client.remoting.remoting_client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import (
    MissingHeaderField,
    ReceiptHandleExpired,
    SubscriptionParseFailed,
    SystemError_,
    TopicNotExist,
)
from protocol.headers_v5 import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    NotificationRequestHeader,
    PopMessageRequestHeader,
)
from tests.helpers import send, wait_until

TOPIC = "hostile"


@pytest.fixture
async def pop_api() -> AsyncIterator[PopAPI]:
    remoting = RemotingClient()
    try:
        yield PopAPI(remoting)
    finally:
        await remoting.close()


def pop_header(**overrides: Any) -> PopMessageRequestHeader:
    fields: dict[str, Any] = {"consumer_group": "hg", "topic": TOPIC, "queue_id": -1, "max_msg_nums": 4,
                              "invisible_time": 10_000, "poll_time": 0}
    fields.update(overrides)
    return PopMessageRequestHeader(**fields)


@pytest.mark.parametrize(("overrides", "error", "text"), [
    ({"max_msg_nums": 33}, SystemError_, "max_msg_nums = 33 is out of range"),
    ({"max_msg_nums": 0}, SystemError_, "max_msg_nums = 0"),
    ({"invisible_time": 0}, SystemError_, "invisible_time = 0"),
    ({"invisible_time": 2**62}, SystemError_, "invisible_time"),
    ({"poll_time": -1}, SystemError_, "poll_time = -1"),
    ({"poll_time": 10**12}, SystemError_, "poll_time"),
    ({"queue_id": 7}, SystemError_, "queue_id 7 is outside"),
    ({"topic": "nope"}, TopicNotExist, "nope"),
    ({"exp_type": "SQL92", "exp": "a > 1"}, SubscriptionParseFailed, "TAG only"),
    ({"init_mode": 5}, SystemError_, "init_mode"),
])
async def test_bad_pops_are_refused(broker: Broker, client_api: ClientAPI, pop_api: PopAPI,
                                    overrides: dict[str, Any], error: type[Exception], text: str) -> None:
    await client_api.create_topic(broker.address, TOPIC, 1)
    with pytest.raises(error, match=text):
        await pop_api.pop_message(broker.address, pop_header(**overrides), 3_000)


async def test_mistyped_fields_are_refused(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, TOPIC, 1)
    fields = pop_header().to_fields() | {"invisible_time": "soon"}
    response = await client_api.remoting.invoke(broker.address, request(RequestCode.POP_MESSAGE, fields), 3_000)
    assert response.code == ResponseCode.SYSTEM_ERROR and "invisible_time" in (response.remark or "")
    with pytest.raises(MissingHeaderField):
        AckMessageRequestHeader.from_fields({"consumer_group": "hg"})


async def test_forged_and_mismatched_handles_are_refused(broker: Broker, client_api: ClientAPI,
                                                         pop_api: PopAPI) -> None:
    await client_api.create_topic(broker.address, TOPIC, 1)
    await send(client_api, broker.address, TOPIC, b"one")
    [popped] = await pop_api.pop_message(broker.address, pop_header(), 3_000)
    handle = popped.receipt_handle
    ack = AckMessageRequestHeader(consumer_group="hg", topic=TOPIC, queue_id=0, extra_info=handle, offset=0)
    for bad, text in [
        (ack.to_fields() | {"extra_info": "garbage"}, "malformed receipt handle"),
        (ack.to_fields() | {"extra_info": "1 2 3 0 0 b 0"}, "malformed receipt handle"),
        (ack.to_fields() | {"offset": 5}, "not queue 0 offset 5"),
        (ack.to_fields() | {"extra_info": handle.replace(handle.split(" ")[0], "999", 1)}, "no longer current"),
        (ack.to_fields() | {"consumer_group": "other"}, "no longer current"),
        (ack.to_fields() | {"topic": "elsewhere"}, "no longer current"),
    ]:
        response = await client_api.remoting.invoke(broker.address, request(RequestCode.ACK_MESSAGE, bad), 3_000)
        assert response.code != ResponseCode.SUCCESS and text in (response.remark or ""), (bad, response.remark)
    change = ChangeInvisibleTimeRequestHeader(consumer_group="hg", topic=TOPIC, queue_id=0, extra_info=handle,
                                              offset=0, invisible_time=2**62)
    with pytest.raises(SystemError_, match="invisible_time"):
        await pop_api.change_invisible_time(broker.address, change, 3_000)
    await pop_api.ack_message(broker.address, ack, 3_000)
    with pytest.raises(ReceiptHandleExpired):
        await pop_api.ack_message(broker.address, ack, 3_000)


async def test_notification_is_held_until_a_message_arrives(broker: Broker, client_api: ClientAPI,
                                                            pop_api: PopAPI) -> None:
    await client_api.create_topic(broker.address, TOPIC, 2)
    header = NotificationRequestHeader(consumer_group="hg", topic=TOPIC, poll_time=100)
    assert await pop_api.notification(broker.address, header, 3_000) is False
    held = asyncio.create_task(pop_api.notification(
        broker.address, NotificationRequestHeader(consumer_group="hg", topic=TOPIC, poll_time=20_000), 25_000))
    await wait_until(lambda: broker.hold_service is not None and broker.hold_service.held_count == 2, what="held")
    await send(client_api, broker.address, TOPIC, b"x", queue_id=1)
    assert await asyncio.wait_for(held, 5) is True
    popped = await pop_api.pop_message(broker.address, pop_header(), 3_000)
    assert [p.message.body for p in popped] == [b"x"]
    assert await pop_api.notification(broker.address, header, 3_000) is False     # in flight now


async def test_batch_ack_answers_each_ack(broker: Broker, client_api: ClientAPI, pop_api: PopAPI) -> None:
    await client_api.create_topic(broker.address, TOPIC, 1)
    for body in (b"a", b"b", b"c"):
        await send(client_api, broker.address, TOPIC, body)
    popped = await pop_api.pop_message(broker.address, pop_header(), 3_000)
    first, second, third = (p.receipt_handle for p in popped)
    results = await pop_api.batch_ack_message(broker.address, "hg", TOPIC, [
        (0, first, 0), (0, first, 0), (0, "garbage", 1), (0, third, 2), (0, second, 7)], 3_000)
    assert results[0] is None and results[3] is None
    assert isinstance(results[1], ReceiptHandleExpired)            # the same handle twice
    assert isinstance(results[2], SystemError_) and "malformed" in str(results[2])
    assert isinstance(results[4], SystemError_) and "not queue 0 offset 7" in str(results[4])
    assert broker.pop_service is not None
    assert list(broker.pop_service.queues[("hg", TOPIC, 0)].in_flight) == [1]      # only b is left
    too_many = [(0, first, 0)] * 1025
    with pytest.raises(SystemError_, match="at most 1024"):
        await pop_api.batch_ack_message(broker.address, "hg", TOPIC, too_many, 3_000)
    response = await client_api.remoting.invoke(broker.address, request(
        RequestCode.BATCH_ACK_MESSAGE, {"consumer_group": "hg", "topic": TOPIC}, b"\xc1junk"), 3_000)
    assert response.code == ResponseCode.SYSTEM_ERROR and "BatchAckBody" in (response.remark or "")
