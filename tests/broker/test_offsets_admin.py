"""Consumer offsets and the admin requests of the broker core."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from protocol.codes import Perm
from protocol.errors import NoPermission, QueryNotFound, SystemError_, TopicNotExist
from protocol.headers import CreateSubscriptionGroupRequestHeader
from tests.conftest import broker_config
from tests.helpers import pull_header, send


async def test_offsets_update_query_and_survive_restart(tmp_path: Path, client_api: ClientAPI) -> None:
    config = broker_config(tmp_path)
    async with Broker(config) as broker:
        await send(client_api, broker.address, "o")
        # No commit yet and the queue starts at 0: RocketMQ answers 0.
        assert await client_api.query_consumer_offset(broker.address, "g1", "o", 0) == 0
        await client_api.update_consumer_offset(broker.address, "g1", "o", 0, 1)
        assert await client_api.query_consumer_offset(broker.address, "g1", "o", 0) == 1
        with pytest.raises(SystemError_, match="commit_offset"):
            await client_api.update_consumer_offset(broker.address, "g1", "o", 0, -5)
        with pytest.raises(TopicNotExist):
            await client_api.query_consumer_offset(broker.address, "g1", "nope", 0)
    saved = json.loads((tmp_path / "store" / "config" / "consumer_offsets.json").read_text())
    assert saved == {"offset_table": {"o@g1": {"0": 1}}}
    async with Broker(config) as broker:
        assert await client_api.query_consumer_offset(broker.address, "g1", "o", 0) == 1


async def test_queue_bounds_and_time_search(broker: Broker, client_api: ClientAPI) -> None:
    before_ms = int(time.time() * 1000)
    for i in range(5):
        await send(client_api, broker.address, "b", str(i).encode())
    address = broker.address
    assert await client_api.get_max_offset(address, "b", 0) == 5
    assert await client_api.get_min_offset(address, "b", 0) == 0
    earliest = await client_api.get_earliest_msg_storetime(address, "b", 0)
    assert before_ms - 5 <= earliest <= int(time.time() * 1000)
    assert await client_api.get_earliest_msg_storetime(address, "b", 1) == -1
    assert await client_api.search_offset(address, "b", 0, before_ms - 60_000) == 0
    assert await client_api.search_offset(address, "b", 0, int(time.time() * 1000) + 60_000) in (4, 5)
    with pytest.raises(SystemError_, match="queue_id"):
        await client_api.get_max_offset(address, "b", 42)


async def test_topic_creation_route_and_permissions(broker: Broker, client_api: ClientAPI) -> None:
    address = broker.address
    await client_api.create_topic(address, "made", queue_nums=8)
    route = await client_api.get_route_info(address, "made")
    assert route.queue_datas[0].read_queue_nums == 8 and route.queue_datas[0].perm == 6
    assert route.broker_datas[0].broker_addrs == {0: address}
    with pytest.raises(TopicNotExist):
        await client_api.get_route_info(address, "never")
    await client_api.create_topic(address, "wo", queue_nums=1, perm=Perm.WRITE)
    await send(client_api, address, "wo")
    with pytest.raises(NoPermission):
        await client_api.pull_message(address, pull_header(topic="wo"), 3_000)
    with pytest.raises(SystemError_, match="must match"):
        await client_api.create_topic(address, "../etc")


async def test_subscription_group_consume_enable(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_subscription_group(
        broker.address, CreateSubscriptionGroupRequestHeader(group_name="off", consume_enable=False))
    await send(client_api, broker.address, "sg")
    with pytest.raises(NoPermission):
        await client_api.pull_message(broker.address, pull_header(topic="sg", group="off"), 3_000)


async def test_view_message_of_unknown_or_malformed_id(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "vm")
    with pytest.raises(QueryNotFound):
        await client_api.view_message(broker.address, "7F0000010000271100000000000FFFFF")
    with pytest.raises(SystemError_, match="malformed msg_id"):
        await client_api.view_message(broker.address, "not-an-id")
