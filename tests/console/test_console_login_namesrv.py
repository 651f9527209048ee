"""The console pointed at a name server (authentication off) whose two brokers have authentication
and authorization on, over real HTTP (urllib with a cookie jar) against real servers: pages want a
login; the password is proven against every broker the name server lists (a wrong one, or a user
one broker does not know, is refused); a Normal user then reads both brokers' pages but sees no
action and its POSTs are refused; the Super user may act."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from broker.broker import Broker
from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient
from conf.namesrv import NamesrvConfig
from console.server import ConsoleServer
from console.state import ConsoleSettings
from namesrv.namesrv import NameServer
from tests.console.test_console_hostile import Browser
from tests.security_helpers import ADMIN, add_user, admin_api, secured_config

READS = [("Topic:*", ["Get", "List", "Sub"]), ("Group:*", ["Get", "List", "Sub"]), ("Cluster", ["Get"])]


async def _wait_listed(name_server: str, names: set[str]) -> None:
    """Until the name server lists exactly the brokers `names` (bounded: 10 s)."""
    remoting = RemotingClient()
    try:
        api = AdminAPI(remoting)
        async with asyncio.timeout(10):
            while set((await api.get_broker_cluster_info(name_server)).broker_addr_table) != names:
                await asyncio.sleep(0.05)
    finally:
        await remoting.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[NameServer, list[Broker], ConsoleServer]]:
    async with AsyncExitStack() as stack:
        ns = await stack.enter_async_context(NameServer(NamesrvConfig(listen_port=0)))
        brokers = [await stack.enter_async_context(Broker(secured_config(
            tmp_path / name, lenient=True, broker_name=name, namesrv_addr=ns.address,
            register_name_server_period_ms=500))) for name in ("broker-a", "broker-b")]
        await _wait_listed(ns.address, {"broker-a", "broker-b"})
        async with admin_api() as api:
            for broker in brokers:
                await api.create_topic(broker.address, f"on-{broker.config.broker_name}", queue_nums=2)
        for broker in brokers:
            await add_user(broker.address, "viewer", READS, password="viewer-secret")
        await add_user(brokers[0].address, "half", READS, password="half-secret")      # unknown to broker-b
        console = await stack.enter_async_context(ConsoleServer(ConsoleSettings(endpoint=ns.address, listen_port=0)))
        yield ns, brokers, console


def _token(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert match is not None, "the page carries the session's CSRF token"
    return match.group(1)


async def test_a_normal_user_logs_in_through_the_name_server_and_only_reads(
        cluster: tuple[NameServer, list[Broker], ConsoleServer]) -> None:
    _, brokers, console = cluster
    browser = Browser()
    status, page = await asyncio.to_thread(browser.fetch, console.url + "/topics")
    assert status == 200 and 'id="password"' in page, "no session: the login page"
    for user, password in [("viewer", "wrong"), ("half", "half-secret"), ("nobody", "viewer-secret")]:
        status, page = await asyncio.to_thread(browser.fetch, console.url + "/login",
                                               {"username": user, "password": password, "next": "/topics"})
        assert status == 401 and "wrong user name or password" in page, user

    status, page = await asyncio.to_thread(browser.fetch, console.url + "/login",
                                           {"username": "viewer", "password": "viewer-secret", "next": "/topics"})
    assert status == 200 and "(read-only)" in page
    assert "on-broker-a" in page and "on-broker-b" in page        # every broker the name server lists
    assert 'class="action"' not in page and "viewer-secret" not in page
    status, page = await asyncio.to_thread(browser.fetch, console.url + "/brokers")
    assert status == 200 and "broker-a" in page and "broker-b" in page
    token = _token(page)
    for path, form in [("/topics", {"topic": "sneaky", "queues": "4"}), ("/topics/on-broker-a/delete", {}),
                       ("/groups/g/reset", {"topic": "on-broker-a", "to": "earliest"}),
                       ("/dlq/g/resend", {"all": "1"})]:
        status, _ = await asyncio.to_thread(browser.fetch, console.url + path, {"csrf_token": token, **form})
        assert status == 403, path
    assert all(b.topics.get("sneaky") is None and b.topics.get(f"on-{b.config.broker_name}") is not None
               for b in brokers)

    admin = Browser()
    status, page = await asyncio.to_thread(admin.fetch, console.url + "/login", {
        "username": ADMIN.access_key, "password": ADMIN.secret_key, "next": "/topics"})
    assert status == 200 and "(read-only)" not in page and 'id="create-topic"' in page
