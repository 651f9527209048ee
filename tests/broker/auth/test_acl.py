"""Authorization on a broker over TCP, with real clients signing their requests: what a Normal
user's ACL lets it do, deny over allow, prefix resources, source networks, retry topics, and
changes to users applying at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.codes import PullSysFlag
from protocol.errors import NoPermission
from protocol.model import PullStatus
from protocol.signing import Credentials
from tests.auth.servers import ROOT, add_user, admin_as, allow, secured, secured_broker
from tests.helpers import pull_header, send


async def test_a_user_with_pub_on_one_topic_sends_there_and_nowhere_else_cannot_pull_nor_administer(
        tmp_path: Path) -> None:
    async with secured_broker(tmp_path) as broker:
        address = broker.address
        billing = await add_user(address, "billing", "billing-secret", allow("Topic:orders", "Pub"))
        async with admin_as(billing) as api:
            result = await send(api, address, "orders")
            assert result.queue_offset == 0
            with pytest.raises(NoPermission, match=r"^NO_PERMISSION: User:billing has no permission to Pub on "
                                                   r"Topic:payments \(request code 10\)$"):
                await send(api, address, "payments")
            with pytest.raises(NoPermission, match="User:billing has no permission to Sub on"):
                await api.pull_message(address, pull_header(topic="orders", group="billing"), 3_000)
            with pytest.raises(NoPermission, match="Create on Topic:orders"):
                await api.create_topic(address, "orders")
            with pytest.raises(NoPermission, match="Delete on Topic:orders"):
                await api.delete_topic(address, "orders")
            with pytest.raises(NoPermission, match="Update on Cluster"):
                await api.create_user(address, "eve", "eve-secret", "Super")
            with pytest.raises(NoPermission, match="Get on Cluster"):
                await api.get_broker_runtime_info(address)
        assert broker.topics.get("payments") is None
        async with admin_as(ROOT) as root:
            assert [u.username for u in await root.list_users(address)] == ["billing", "root"]


async def test_a_consumer_needs_sub_on_the_topic_and_on_its_group(tmp_path: Path) -> None:
    async with secured_broker(tmp_path) as broker, admin_as(ROOT) as root:
        address = broker.address
        await send(root, address, "orders")
        topic_only = await add_user(address, "half", "half-secret", allow("Topic:orders", "Sub"))
        reader = await add_user(address, "reader", "reader-secret", allow("Topic:orders", "Sub"),
                                allow("Group:readers", "Sub"))
        header = pull_header(topic="orders", group="readers", commit_offset=0,
                             sys_flag=PullSysFlag.SUBSCRIPTION)
        async with admin_as(topic_only) as api:
            with pytest.raises(NoPermission, match=r"Sub on Group:readers \(request code 11\)"):
                await api.pull_message(address, header, 3_000)
        async with admin_as(reader) as api:
            result = await api.pull_message(address, header, 3_000)
            assert result.status is PullStatus.FOUND and len(result.messages) == 1
            await api.update_consumer_offset(address, "readers", "orders", 0, 1)
            assert await api.query_consumer_offset(address, "readers", "orders", 0) == 1
            assert await api.get_max_offset(address, "orders", 0) == 1     # where to start: Sub is enough
            with pytest.raises(NoPermission, match="Sub or Update on Group:others"):
                await api.update_consumer_offset(address, "others", "orders", 0, 1)
            with pytest.raises(NoPermission, match="Sub on Group:others"):        # another group's retries
                await send(api, address, "%RETRY%others")
            with pytest.raises(NoPermission, match="Pub on Topic:orders"):       # a reader, not a writer
                await send(api, address, "orders")
        assert broker.offsets.query("others", "orders", 0) is None


async def test_deny_beats_allow(tmp_path: Path) -> None:
    async with secured_broker(tmp_path) as broker:
        address = broker.address
        user = await add_user(address, "u", "u-secret", allow("Topic:orders-*", "Pub"),
                              allow("Topic:orders-secret", "Pub", decision="Deny"),
                              allow("Topic:audit", "All"),
                              allow("*", "Pub", decision="Deny", source_ips=("127.0.0.0/8",)))
        async with admin_as(user) as api:
            for topic in ("orders-secret", "orders-eu", "audit"):     # the last Deny covers every topic from here
                with pytest.raises(NoPermission, match=f"Pub on Topic:{topic} "):
                    await send(api, address, topic)
        async with admin_as(ROOT) as root:     # without the catch-all Deny, only the specific one remains
            await root.delete_acl(address, "User:u", ["*"])
        async with admin_as(user) as api:
            await send(api, address, "orders-eu")
            await send(api, address, "audit")
            with pytest.raises(NoPermission, match="Pub on Topic:orders-secret "):
                await send(api, address, "orders-secret")


async def test_prefix_resources_match_names_that_start_with_them(tmp_path: Path) -> None:
    async with secured_broker(tmp_path) as broker:
        address = broker.address
        user = await add_user(address, "eu", "eu-secret", allow("Topic:orders-eu-*", "Pub"), allow("Topic:*", "Get"))
        async with admin_as(user) as api:
            await send(api, address, "orders-eu-1")
            await send(api, address, "orders-eu-")
            for topic in ("orders-eu", "orders-us-1", "xorders-eu-1"):
                with pytest.raises(NoPermission, match=f"Pub on Topic:{topic} "):
                    await send(api, address, topic)
            assert await api.get_max_offset(address, "orders-eu-1", 0) in (0, 1)   # Get on every topic
            with pytest.raises(NoPermission, match=r"List on Topic:\* "):     # listing them is another action
                await api.get_all_topic_config(address)


async def test_source_networks_limit_where_an_entry_applies(tmp_path: Path) -> None:
    async with secured_broker(tmp_path) as broker:
        address = broker.address
        remote_only = await add_user(address, "remote", "remote-secret",
                                     allow("Topic:orders", "Pub", source_ips=("10.0.0.0/8",)))
        local = await add_user(address, "local", "local-secret",
                               allow("Topic:orders", "Pub", source_ips=("10.0.0.0/8", "127.0.0.1")))
        async with admin_as(remote_only) as api:     # 10.0.0.0/8 does not match 127.0.0.1
            with pytest.raises(NoPermission, match="Pub on Topic:orders "):
                await send(api, address, "orders")
        async with admin_as(local) as api:
            await send(api, address, "orders")


async def test_user_changes_apply_at_once(tmp_path: Path) -> None:
    async with secured_broker(tmp_path, secured(max_failures_per_address=100)) as broker, admin_as(ROOT) as root:
        address = broker.address
        user = await add_user(address, "u", "first", allow("Topic:t", "Pub"))
        async with admin_as(user) as api:
            await send(api, address, "t")
            await root.update_user(address, "u", user_status="disable")
            with pytest.raises(NoPermission, match=r"^NO_PERMISSION: authentication failed for u$"):
                await send(api, address, "t")
            await root.update_user(address, "u", user_status="enable")
            await send(api, address, "t")
            await root.update_user(address, "u", password="second")
            with pytest.raises(NoPermission, match="authentication failed for u"):
                await send(api, address, "t")
        async with admin_as(Credentials("u", "second")) as api:
            await send(api, address, "t")
            await root.update_acl(address, "User:u", [allow("Topic:t", "Pub", decision="Deny")])
            with pytest.raises(NoPermission, match="Pub on Topic:t "):
                await send(api, address, "t")
            await root.update_user(address, "u", user_type="Super")     # a Super user's ACL is not consulted
            await send(api, address, "t")
            await root.delete_user(address, "u")
            with pytest.raises(NoPermission, match="authentication failed for u"):
                await send(api, address, "t")
