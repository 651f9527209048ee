"""Reads redirected to a slave (RocketMQ `suggestWhichBrokerId`): with `slave_read_enable`, a pull
that reads messages further behind the log end than `store.access_message_in_memory_max_ratio` % of
RAM is answered with the slave's id, and the consumers pull that queue from the slave next; a
slave answers 0 once the consumer caught up, and a slave that fails sends it back to the master.
A ratio of 0 makes every pull that found messages "behind"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from broker.broker import Broker
from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, MessageExt, PullConsumer, PushConsumer
from client.api import ClientAPI
from conf.broker import BrokerConfig
from conf.client import ClientConfig
from conf.namesrv import NamesrvConfig
from conf.store import StoreConfig
from namesrv.namesrv import NameServer
from protocol.errors import SystemError_
from protocol.headers import CreateSubscriptionGroupRequestHeader
from protocol.model import PullStatus
from tests.broker.ha.test_replication import slave_caught_up
from tests.conftest import TEST_DELAY_LEVELS, broker_config
from tests.helpers import pull_header, send, wait_until


def _config(root: Path, name: str, ratio: int, **overrides: Any) -> BrokerConfig:
    store = StoreConfig(path=root / name / "store", commit_log_segment_bytes=1 << 20, consume_queue_segment_units=1_000,
                        message_delay_level=TEST_DELAY_LEVELS, access_message_in_memory_max_ratio=ratio)
    return broker_config(root / name, store=store, **{"slave_read_enable": True, "ha_slave_sync_interval_ms": 50,
                                                      **overrides})


async def test_master_suggests_the_slave_and_the_slave_the_master(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(_config(tmp_path, "master", 0)) as master:
        assert master.replication is not None
        async with Broker(_config(tmp_path, "slave", 40, broker_role="SLAVE", broker_id=1,
                                  ha_master_address=f"127.0.0.1:{master.replication.ha_address_port}")) as slave:
            for i in range(10):
                await send(client_api, master.address, "redirect", f"m{i}".encode())
            await slave_caught_up(master, slave)
            await wait_until(lambda: slave.store is not None and slave.store.get_max_offset("redirect", 0) == 10,
                             what="slave dispatched")
            header = pull_header(topic="redirect", queue_id=0)
            behind = await client_api.pull_message(master.address, header, 3_000)
            assert behind.status is PullStatus.FOUND and behind.suggest_which_broker_id == 1
            caught_up = await client_api.pull_message(slave.address, header, 3_000)
            assert caught_up.status is PullStatus.FOUND and caught_up.suggest_which_broker_id == 0
            assert [m.body for m in caught_up.messages] == [m.body for m in behind.messages]
            # at the queue's end nothing is found: no suggestion
            end = await client_api.pull_message(master.address, pull_header(topic="redirect", queue_offset=10), 3_000)
            assert end.status is not PullStatus.FOUND and end.suggest_which_broker_id == 0


async def test_a_master_without_slave_read_enable_suggests_itself(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(_config(tmp_path, "master", 0, slave_read_enable=False)) as master:
        await send(client_api, master.address, "redirect", b"x")
        result = await client_api.pull_message(master.address, pull_header(topic="redirect"), 3_000)
        assert result.status is PullStatus.FOUND and result.suggest_which_broker_id == 0


def _consumer(kind: str, namesrv_addr: str, consumed: list[str]) -> PushConsumer | PullConsumer:
    client_config = ClientConfig(poll_route_interval_ms=200, persist_offset_interval_ms=200)
    if kind == "pull":
        return PullConsumer("redirected", namesrv_addr, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            client_config=client_config, pull_batch_size=8, pull_threshold_for_queue=16)

    def listener(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        time.sleep(0.001 * len(messages))           # a slow listener: 1 ms a message
        consumed.extend(m.body.decode() for m in messages)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer("redirected", namesrv_addr, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            client_config=client_config, pull_batch_size=8, consume_thread_min=1, consume_thread_max=1,
                            pull_threshold_for_queue=16, pull_time_delay_when_exception_ms=100)
    consumer.register_listener(listener)
    return consumer


@pytest.mark.parametrize("kind", ["push", "pull"])
async def test_consumers_follow_the_suggestion_and_fall_back_to_the_master(tmp_path: Path, client_api: ClientAPI,
                                                                           kind: str) -> None:
    """A slow consumer with a small cache (flow control) reads a backlog from the slave the
    master suggests; the slave stops, and the rest and what comes next are read from the master:
    every message at least once."""
    consumed: list[str] = []

    async with NameServer(NamesrvConfig(listen_port=0)) as namesrv:
        consumer = _consumer(kind, namesrv.address, consumed)
        consumer.subscribe("redirect")

        async def consume_until(wanted: set[str]) -> None:
            if isinstance(consumer, PushConsumer):
                await wait_until(lambda: wanted <= set(consumed), 30, "every message consumed")
                return
            deadline = time.monotonic() + 30
            while not wanted <= set(consumed):
                assert time.monotonic() < deadline, f"{len(wanted - set(consumed))} not consumed"
                consumed.extend(m.body.decode() for m in await consumer.poll(100))

        async with Broker(_config(tmp_path, "master", 0, namesrv_addr=namesrv.address)) as master:
            sent = [f"b{i}" for i in range(200)]
            for i, body in enumerate(sent):
                await send(client_api, master.address, "redirect", body.encode(), queue_id=i % 4)
            try:
                async with Broker(_config(tmp_path, "slave", 0, namesrv_addr=namesrv.address, broker_role="SLAVE",
                                          broker_id=1)) as slave:
                    await slave_caught_up(master, slave)
                    await wait_until(lambda: (route := namesrv.routes.topic_route("redirect")) is not None
                                     and 1 in route.broker_datas[0].broker_addrs, what="slave routed")
                    await consumer.start()
                    await consume_until(set(sent[:100]))
                    assert slave.metrics.messages_out.row(("redirect", "redirected"))[0] > 0, \
                        "no pull followed the suggestion"
                more = [f"a{i}" for i in range(40)]         # the slave is gone: the master serves the rest
                for i, body in enumerate(more):
                    await send(client_api, master.address, "redirect", body.encode(), queue_id=i % 4)
                await consume_until(set(sent) | set(more))
            finally:
                await consumer.shutdown()


async def test_a_group_sets_where_its_pulls_go_and_out_of_range_ids_are_refused(tmp_path: Path,
                                                                                client_api: ClientAPI) -> None:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP's `broker_id` / `which_broker_when_consume_slowly` (the
    ids a master suggests); a hostile admin's negative or huge id is refused, the group unchanged."""
    async with Broker(_config(tmp_path, "master", 0)) as master:
        await send(client_api, master.address, "redirect", b"x")
        await client_api.create_subscription_group(master.address, CreateSubscriptionGroupRequestHeader(
            group_name="g", which_broker_when_consume_slowly=2))
        behind = await client_api.pull_message(master.address, pull_header(topic="redirect"), 3_000)
        assert behind.suggest_which_broker_id == 2
        for bad in (CreateSubscriptionGroupRequestHeader(group_name="g", broker_id=-1),
                    CreateSubscriptionGroupRequestHeader(group_name="g", which_broker_when_consume_slowly=2**31 - 1)):
            with pytest.raises(SystemError_, match="within 0"):
                await client_api.create_subscription_group(master.address, bad)
        again = await client_api.pull_message(master.address, pull_header(topic="redirect"), 3_000)
        assert again.suggest_which_broker_id == 2
