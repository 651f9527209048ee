"""HEART_BEAT, the consumer registry, NOTIFY_CONSUMER_IDS_CHANGED on join/leave, UNREGISTER_CLIENT."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from broker.broker import Broker
from broker.registry.ids_changed import IdsChangedNotifier
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.namesrv import NamesrvConfig
from namesrv.namesrv import NameServer
from protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData
from protocol.channel import Channel
from protocol.codes import PullSysFlag, RequestCode
from protocol.command import RemotingCommand
from protocol.errors import ResponseError, SubscriptionParseFailed, SystemError_
from protocol.model import PullStatus
from tests.conftest import broker_config
from tests.helpers import pull_header, send, wait_until


class Member:
    """A consumer connection of its own that records the group notifications it receives."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.remoting = RemotingClient()
        self.api = ClientAPI(self.remoting)
        self.notified: asyncio.Queue[str] = asyncio.Queue()
        self.remoting.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)

    def _on_notify(self, channel: Channel, cmd: RemotingCommand) -> None:
        self.notified.put_nowait(cmd.fields["consumer_group"])

    async def heartbeat(self, address: str, group: str = "grp", topic: str = "rt", expression: str = "*",
                        sub_version: int = 1) -> None:
        sub = SubscriptionData(topic=topic, sub_string=expression, sub_version=sub_version)
        await self.api.send_heartbeat(address, HeartbeatData(
            client_id=self.client_id, consumer_data_set=[ConsumerData(group_name=group,
                                                                      subscription_data_set=[sub])]))

    async def next_notification(self) -> str:
        return await asyncio.wait_for(self.notified.get(), timeout=2)


@asynccontextmanager
async def member(client_id: str) -> AsyncIterator[Member]:
    m = Member(client_id)
    try:
        yield m
    finally:
        await m.remoting.close()


async def test_join_and_leave_notify_every_member(broker: Broker, client_api: ClientAPI) -> None:
    address = broker.address
    async with member("c1") as first:
        await first.heartbeat(address)
        assert await first.next_notification() == "grp"
        assert await client_api.get_consumer_id_list(address, "grp") == ["c1"]
        async with member("c2") as second:
            await second.heartbeat(address)
            assert await first.next_notification() == "grp"
            assert await second.next_notification() == "grp"
            assert sorted(await client_api.get_consumer_id_list(address, "grp")) == ["c1", "c2"]
            await second.heartbeat(address)              # same channel, same subscriptions: no change
            await first.heartbeat(address)
            assert first.notified.empty() and second.notified.empty()
        # c2's connection closed: the group changed at once.
        assert await first.next_notification() == "grp"
        assert await client_api.get_consumer_id_list(address, "grp") == ["c1"]
        await first.api.unregister_client(address, "c1", consumer_group="grp")
        with pytest.raises(SystemError_, match="no consumer"):
            await client_api.get_consumer_id_list(address, "grp")


async def test_registered_subscription_is_used_by_pulls(broker: Broker) -> None:
    address = broker.address
    async with member("c1") as m:
        await send(m.api, address, "rt", b"a", tags="A")
        await send(m.api, address, "rt", b"b", tags="B")
        await m.heartbeat(address, expression="B", sub_version=5)
        header = pull_header(topic="rt", group="grp", sys_flag=0)
        result = await m.api.pull_message(address, header, 3_000)
        assert result.status is PullStatus.FOUND and [x.body for x in result.messages] == [b"b"]
        newer = pull_header(topic="rt", group="grp", sys_flag=0)
        object.__setattr__(newer, "sub_version", 6)
        with pytest.raises(ResponseError, match="SUBSCRIPTION_NOT_LATEST"):
            await m.api.pull_message(address, newer, 3_000)
        # the retry topic of the group was created with the group's queue count
        route = await m.api.get_route_info(address, "%RETRY%grp")
        assert route.queue_datas[0].read_queue_nums == 1
        assert PullSysFlag.SUBSCRIPTION not in PullSysFlag(header.sys_flag)


async def test_bad_heartbeats_are_refused(broker: Broker) -> None:
    async with member("c1") as m:
        with pytest.raises(SubscriptionParseFailed):
            await m.heartbeat(broker.address, expression="||")
        with pytest.raises(SystemError_, match="must match"):
            await m.heartbeat(broker.address, group="bad group")


async def test_silent_channels_expire(broker: Broker) -> None:
    async with member("quiet") as quiet, member("watcher") as watcher:
        await quiet.heartbeat(broker.address)
        await watcher.heartbeat(broker.address)
        await watcher.next_notification()
        await wait_until(lambda: len(broker.consumers.get("grp").channels) == 2)  # type: ignore[union-attr]
        # Pretend the quiet member's last heartbeat is older than the expiry.
        group = broker.consumers.get("grp")
        assert group is not None
        for info in group.channels.values():
            if info.client_id == "quiet":
                info.last_update_ms -= broker.config.channel_expired_timeout_ms + 1
        assert broker._housekeeping is not None
        expired = broker._housekeeping.scan()
        assert len(expired) == 1
        assert group.client_ids() == ["watcher"]
        assert await watcher.next_notification() == "grp"


async def test_a_new_topic_notifies_the_groups_subscribing_to_it_once(broker: Broker, client_api: ClientAPI) -> None:
    async with member("c1") as waiting, member("c2") as other:
        await waiting.heartbeat(broker.address, group="waiting", topic="not-yet")
        await other.heartbeat(broker.address, group="other", topic="elsewhere")
        assert await waiting.next_notification() == "waiting"      # joining
        assert await other.next_notification() == "other"
        await client_api.create_topic(broker.address, "not-yet", queue_nums=2)
        assert await waiting.next_notification() == "waiting"      # the topic it waits for exists
        await send(client_api, broker.address, "elsewhere-not", b"auto-created, subscribed by nobody")
        await client_api.create_topic(broker.address, "not-yet", queue_nums=4)   # a change, not a creation
        await send(client_api, broker.address, "not-yet", b"x")
        await waiting.heartbeat(broker.address, group="waiting", topic="not-yet")   # a round trip on each
        await other.heartbeat(broker.address, group="other", topic="elsewhere")
        assert waiting.notified.empty() and other.notified.empty()


async def test_through_name_servers_a_new_topic_is_announced_once_they_route_it(tmp_path: Path) -> None:
    """The notice follows the registration that carries the topic: a consumer told of it finds its
    route on the name servers."""
    async with NameServer(NamesrvConfig(listen_port=0)) as ns, \
            Broker(broker_config(tmp_path, namesrv_addr=ns.address)) as broker, member("c1") as waiting:
        routed_when_told: list[bool] = []
        waiting.remoting.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, lambda channel, cmd: (
            routed_when_told.append("not-yet" in ns.routes.topic_queue_table)))
        await waiting.heartbeat(broker.address, group="waiting", topic="not-yet")
        await wait_until(lambda: routed_when_told == [False], 2.0, "told of joining")
        await send(waiting.api, broker.address, "not-yet", b"auto-creates it")
        await wait_until(lambda: len(routed_when_told) == 2, 2.0, "told of the topic")
        assert routed_when_told == [False, True]


async def test_a_burst_of_changes_is_announced_in_a_few_rounds_per_window() -> None:
    """RocketMQ sends a round per change; here `max_rounds` go at once, then the rest of the window's
    changes in one round at its end, which opens the next window."""
    notifier = IdsChangedNotifier(lambda group: [], interval_ms=200, max_rounds=2)
    try:
        for _ in range(50):
            notifier.changed("g")
        notifier.changed("other")
        assert notifier.rounds == 3                     # g twice at once, other once
        await wait_until(lambda: notifier.rounds == 4, 1.0, "g's window ended with one round")
        notifier.changed("g")                           # the second round of g's new window: at once
        notifier.changed("g")
        assert notifier.rounds == 5
        await wait_until(lambda: notifier.rounds == 6, 1.0, "and the change after it at that window's end")
    finally:
        notifier.close()
