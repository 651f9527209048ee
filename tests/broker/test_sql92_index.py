"""Pulls of a registered SQL92 subscription read only indexed matches (`MatchIndex`): one pull
reaches a match far past the 800-entry scan step, batch limits hold, a backlog from before the
registration is still scanned, and the messages delivered are the same as a scan's."""

from __future__ import annotations

import dataclasses

from broker.broker import Broker
from client.api import ClientAPI
from protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData
from protocol.headers import PullMessageRequestHeader, SendBatchMessageRequestHeader
from protocol.message import Message, encode_batch_body
from protocol.model import PullStatus
from tests.helpers import pull_header

EXPRESSION = "bucket = 7"


async def register(api: ClientAPI, address: str, group: str, topic: str, expression: str = EXPRESSION) -> None:
    sub = SubscriptionData(topic=topic, sub_string=expression, expression_type="SQL92", sub_version=1)
    await api.send_heartbeat(address, HeartbeatData(client_id="c1", consumer_data_set=[
        ConsumerData(group_name=group, subscription_data_set=[sub])]))


async def send_buckets(api: ClientAPI, address: str, topic: str, buckets: list[int], first: int = 0) -> None:
    """Body "<number>:<bucket>", numbered from `first`."""
    for start in range(0, len(buckets), 500):
        messages = [Message(topic, f"{first + start + i}:{b}".encode(), properties={"bucket": str(b)})
                    for i, b in enumerate(buckets[start:start + 500])]
        await api.send_batch(address, SendBatchMessageRequestHeader(producer_group="pg", topic=topic, queue_id=0),
                             encode_batch_body(messages))


def registered_pull(group: str, topic: str, queue_offset: int = 0) -> PullMessageRequestHeader:
    return dataclasses.replace(pull_header(topic=topic, group=group, sys_flag=0, queue_offset=queue_offset),
                               sub_version=1, subscription=None, expression_type=None)


def carried_pull(topic: str, queue_offset: int = 0, expression: str = EXPRESSION) -> PullMessageRequestHeader:
    return dataclasses.replace(pull_header(topic=topic, group="unregistered", queue_offset=queue_offset),
                               subscription=expression, expression_type="SQL92")


async def pull_all(api: ClientAPI, address: str, header: PullMessageRequestHeader) -> tuple[list[bytes], int]:
    """Bodies delivered from header's offset to the queue's end, and the number of pulls."""
    bodies: list[bytes] = []
    pulls = 0
    while True:
        result = await api.pull_message(address, header, 3_000)
        pulls += 1
        bodies += [m.body for m in result.messages]
        if result.status is PullStatus.NO_NEW_MSG:
            return bodies, pulls
        header = dataclasses.replace(header, queue_offset=result.next_begin_offset)


async def test_one_pull_reaches_a_match_past_the_scan_step(broker: Broker, client_api: ClientAPI) -> None:
    await register(client_api, broker.address, "ig", "ix")
    await send_buckets(client_api, broker.address, "ix", [0] * 2_000 + [7] + [0] * 10)
    result = await client_api.pull_message(broker.address, registered_pull("ig", "ix"), 3_000)
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"2000:7"]
    assert result.next_begin_offset == 2_011
    # the same expression carried in the pull uses the index too
    carried = await client_api.pull_message(broker.address, carried_pull("ix"), 3_000)
    assert [m.body for m in carried.messages] == [b"2000:7"]
    # nothing matching to the end: one step to the max offset
    empty = await client_api.pull_message(broker.address, registered_pull("ig", "ix", 2_001), 3_000)
    assert empty.status is PullStatus.NO_MATCHED_MSG and empty.next_begin_offset == 2_011
    # another expression is not indexed: the scan moves 800 entries at a time
    other = await client_api.pull_message(broker.address, carried_pull("ix", expression="bucket = 8"), 3_000)
    assert other.status is PullStatus.NO_MATCHED_MSG and other.next_begin_offset == 800


async def test_batch_limits_hold_on_indexed_reads(broker: Broker, client_api: ClientAPI) -> None:
    await register(client_api, broker.address, "bg", "bx")
    buckets = [7 if i % 3 == 0 else 1 for i in range(300)]
    await send_buckets(client_api, broker.address, "bx", buckets)
    first = await client_api.pull_message(broker.address, registered_pull("bg", "bx"), 3_000)
    assert len(first.messages) == 32 and first.next_begin_offset == 96       # the 33rd match
    bodies, _ = await pull_all(client_api, broker.address, registered_pull("bg", "bx"))
    assert bodies == [f"{i}:7".encode() for i in range(300) if i % 3 == 0]


async def test_backlog_from_before_registration_is_scanned(broker: Broker, client_api: ClientAPI) -> None:
    buckets = [7 if i % 50 == 0 else 0 for i in range(1_500)]
    await send_buckets(client_api, broker.address, "pre", buckets[:1_000])
    await register(client_api, broker.address, "pg1", "pre")
    await send_buckets(client_api, broker.address, "pre", buckets[1_000:], first=1_000)
    expected = [f"{i}:7".encode() for i, b in enumerate(buckets) if b == 7]
    indexed, _ = await pull_all(client_api, broker.address, registered_pull("pg1", "pre"))
    scanned, _ = await pull_all(client_api, broker.address, carried_pull("pre", expression="bucket = 7.0"))
    assert indexed == scanned == expected
