"""SQL92 subscriptions on a real broker over TCP: pulls carrying their subscription or relying on
the heartbeat's, NO_MATCHED_MSG over stretches that do not match, held pulls woken only by
matching messages, CHECK_CLIENT_CONFIG, the switch that turns SQL92 off, and retry filtering."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from protocol.bodies import CheckClientRequestBody, ConsumerData, HeartbeatData, SubscriptionData
from protocol.codes import PullSysFlag
from protocol.errors import SubscriptionParseFailed, SystemError_
from protocol.headers import PullMessageRequestHeader, SendBatchMessageRequestHeader
from protocol.message import Message, encode_batch_body
from protocol.model import PullStatus
from protocol.topics import retry_topic
from tests.conftest import broker_config
from tests.helpers import held_pulls, pull_header, send


def sql_pull(expression: str, **kwargs: object) -> PullMessageRequestHeader:
    header = pull_header(subscription=expression, **kwargs)  # type: ignore[arg-type]
    return dataclasses.replace(header, expression_type="SQL92")


async def send_amounts(api: ClientAPI, address: str, topic: str, amounts: list[int]) -> None:
    """One batch: each message has TAGS paid (odd) or refund (even) and property amount."""
    messages = [Message(topic, str(a).encode(), tags="paid" if a % 2 else "refund", properties={"amount": str(a)})
                for a in amounts]
    await api.send_batch(address, SendBatchMessageRequestHeader(producer_group="pg", topic=topic, queue_id=0),
                         encode_batch_body(messages))


async def test_pull_delivers_only_matching_messages(broker: Broker, client_api: ClientAPI) -> None:
    await send_amounts(client_api, broker.address, "sq", [50, 150, 99, 300, 101])
    await send(client_api, broker.address, "sq", b"none")                  # no amount: unknown
    result = await client_api.pull_message(
        broker.address, sql_pull("TAGS IN ('paid') AND amount > 100", topic="sq"), timeout_ms=3_000)
    assert result.status is PullStatus.FOUND
    assert [m.body for m in result.messages] == [b"101"]
    assert result.next_begin_offset == 6
    result = await client_api.pull_message(broker.address, sql_pull("amount >= 100", topic="sq"), 3_000)
    assert [m.body for m in result.messages] == [b"150", b"300", b"101"]


async def test_a_stretch_without_matches_is_skipped_a_bounded_step_at_a_time(
        broker: Broker, client_api: ClientAPI) -> None:
    """NO_MATCHED_MSG moves next_begin_offset past what was examined: at most max(800, max_msg_nums)
    consume-queue entries per pull (REFERENCE.md §2.1), so a pull never reads without bound."""
    await send_amounts(client_api, broker.address, "sk", list(range(900)))
    await send(client_api, broker.address, "sk", b"hit", properties={"amount": "-1"})
    header = sql_pull("amount < 0", topic="sk")
    first = await client_api.pull_message(broker.address, header, 3_000)
    assert first.status is PullStatus.NO_MATCHED_MSG and first.next_begin_offset == 800
    second = await client_api.pull_message(
        broker.address, dataclasses.replace(header, queue_offset=first.next_begin_offset), 3_000)
    assert second.status is PullStatus.FOUND and [m.body for m in second.messages] == [b"hit"]
    assert second.next_begin_offset == 901


async def test_bad_expression_in_a_pull_is_refused_with_its_position(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "bad")
    with pytest.raises(SubscriptionParseFailed) as caught:
        await client_api.pull_message(broker.address, sql_pull("amount > 1 garbage", topic="bad"), 3_000)
    assert "line 1, column 12" in caught.value.remark and "^" in caught.value.remark


async def test_held_pull_wakes_only_for_a_matching_message(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "hw")
    header = sql_pull("region = 'eu'", topic="hw", queue_offset=1, suspend_timeout_ms=10_000)
    pull = asyncio.create_task(client_api.pull_message(broker.address, header, timeout_ms=15_000))
    await held_pulls(broker, topic="hw", count=1)
    for region in ("us", "asia"):
        await send(client_api, broker.address, "hw", region.encode(), properties={"region": region})
    await send(client_api, broker.address, "hw", b"no region")
    assert broker.hold_service is not None
    assert broker.hold_service.sweep() == 0, "the safety sweep woke it for non-matching messages"
    done, _ = await asyncio.wait({pull}, timeout=0.2)
    assert not done, "a non-matching message woke the filtered pull"
    await send(client_api, broker.address, "hw", b"eu", properties={"region": "eu"})
    result = await asyncio.wait_for(pull, timeout=1)
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"eu"]
    assert result.next_begin_offset == 5


async def heartbeat(api: ClientAPI, address: str, group: str, topic: str, expression: str,
                    expression_type: str = "SQL92", sub_version: int = 1) -> None:
    sub = SubscriptionData(topic=topic, sub_string=expression, expression_type=expression_type,
                           sub_version=sub_version)
    await api.send_heartbeat(address, HeartbeatData(client_id="c1", consumer_data_set=[
        ConsumerData(group_name=group, subscription_data_set=[sub])]))


async def test_registered_sql_subscription_filters_pulls(broker: Broker, client_api: ClientAPI) -> None:
    await send_amounts(client_api, broker.address, "reg", [5, 500])
    await heartbeat(client_api, broker.address, "rg", "reg", "amount > 100")
    header = dataclasses.replace(pull_header(topic="reg", group="rg", sys_flag=0), sub_version=1,
                                 subscription=None, expression_type=None)
    result = await client_api.pull_message(broker.address, header, 3_000)
    assert [m.body for m in result.messages] == [b"500"]
    # a newer version with another expression replaces it
    await heartbeat(client_api, broker.address, "rg", "reg", "amount < 100", sub_version=2)
    result = await client_api.pull_message(broker.address, dataclasses.replace(header, sub_version=2), 3_000)
    assert [m.body for m in result.messages] == [b"5"]


async def test_registered_bad_expression_refuses_the_pulls(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "rb")
    await heartbeat(client_api, broker.address, "rbg", "rb", "amount >")
    header = dataclasses.replace(pull_header(topic="rb", group="rbg", sys_flag=0), sub_version=1)
    with pytest.raises(SubscriptionParseFailed, match="column 9"):
        await client_api.pull_message(broker.address, header, 3_000)


def check_body(expression: str, expression_type: str = "SQL92") -> CheckClientRequestBody:
    return CheckClientRequestBody(client_id="c1", group="cg", subscription_data=SubscriptionData(
        topic="t", sub_string=expression, expression_type=expression_type))


async def test_check_client_config(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.check_client_config(broker.address, check_body("a IS NOT NULL AND b BETWEEN 1 AND 2"))
    await client_api.check_client_config(broker.address, check_body("A || B", "TAG"))
    with pytest.raises(SubscriptionParseFailed) as caught:
        await client_api.check_client_config(broker.address, check_body("a = 1 AND\n  b > 'x'"))
    assert "line 2, column 7" in caught.value.remark
    assert "\n    b > 'x'\n        ^" in caught.value.remark
    with pytest.raises(SubscriptionParseFailed):
        await client_api.check_client_config(broker.address, check_body("||", "TAG"))
    with pytest.raises(SubscriptionParseFailed, match="expression_type"):
        await client_api.check_client_config(broker.address, check_body("a", "CLASS"))


async def test_sql92_can_be_turned_off(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, filter_support_sql92=False)) as broker:
        await send(client_api, broker.address, "off")
        with pytest.raises(SystemError_, match="filter_support_sql92"):
            await client_api.pull_message(broker.address, sql_pull("a = 1", topic="off"), 3_000)
        with pytest.raises(SystemError_, match="filter_support_sql92"):
            await client_api.check_client_config(broker.address, check_body("a = 1"))
        await client_api.check_client_config(broker.address, check_body("*", "TAG"))


@pytest.mark.parametrize("filter_support_retry", [False, True])
async def test_retried_messages_are_filtered_only_with_filter_support_retry(
        tmp_path: Path, client_api: ClientAPI, filter_support_retry: bool) -> None:
    """With the flag, a retry topic pull judges each message by the group's SQL92 expression for its
    RETRY_TOPIC (RocketMQ ExpressionForRetryMessageFilter); a TAG-subscribed original matches."""
    config = broker_config(tmp_path, filter_support_retry=filter_support_retry)
    async with Broker(config) as broker:
        group, address = "rtg", broker.address
        retry = retry_topic(group)
        sub = SubscriptionData(topic="orders", sub_string="amount > 100", expression_type="SQL92", sub_version=1)
        everything = SubscriptionData(topic=retry, sub_string="*", sub_version=1)
        tagged = SubscriptionData(topic="news", sub_string="A", sub_version=1)
        await client_api.send_heartbeat(address, HeartbeatData(client_id="c1", consumer_data_set=[
            ConsumerData(group_name=group, subscription_data_set=[sub, everything, tagged])]))
        for body, original, amount in ((b"small", "orders", "5"), (b"big", "orders", "500"),
                                       (b"news", "news", "1"), (b"gone", "other", "1")):
            await send(client_api, address, retry, body, properties={"RETRY_TOPIC": original, "amount": amount})
        header = dataclasses.replace(pull_header(topic=retry, group=group, sys_flag=0), sub_version=1)
        result = await client_api.pull_message(address, header, 3_000)
        bodies = [m.body for m in result.messages]
        assert bodies == ([b"big", b"news", b"gone"] if filter_support_retry else [b"small", b"big", b"news", b"gone"])


async def test_sql_pull_with_commit_offset_flag_still_commits(broker: Broker, client_api: ClientAPI) -> None:
    await send_amounts(client_api, broker.address, "co", [1])
    flags = PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET
    header = dataclasses.replace(sql_pull("amount > 5", topic="co", group="cog"), sys_flag=flags, commit_offset=1)
    result = await client_api.pull_message(broker.address, header, 3_000)
    assert result.status is PullStatus.NO_MATCHED_MSG and result.next_begin_offset == 1
    assert await client_api.query_consumer_offset(broker.address, "cog", "co", 0) == 1
