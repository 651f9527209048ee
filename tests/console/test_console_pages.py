"""The web console in a real headless Chromium against a real broker with consumer groups behind:
every page opens (a screenshot of each is saved), the lag a group page shows equals `rocketq
admin consumer progress --json`, an offset reset from the page moves the running consumers, a
DLQ resend from the page reaches a listener, a message is found by key. One broker, console and
browser for the module."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from broker.broker import Broker
from client import ConsumeConcurrentlyStatus, Message, Producer, PushConsumer
from client.admin_api import AdminAPI
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.client import ClientConfig
from console.server import ConsoleServer
from console.state import ConsoleSettings
from protocol.message import MessageExt
from tests.admin.cli_runner import rocketq_json
from tests.client.test_push_consumer import OK, Collector, consumer, produce
from tests.conftest import broker_config
from tests.console.browser import chromium, screenshot_dir
from tests.helpers import pull_header, send, wait_until
from tests.trace.helpers import events as events_of
from tests.trace.helpers import trace_until

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOPIC, GROUP, IDLE_GROUP = "orders", "billing", "audit"


class SlowCollector(Collector):
    """A listener that blocks until released: its queues keep lag while the test looks."""


@dataclass
class Setup:
    broker: Broker
    console: ConsoleServer
    browser: Any
    shots: Path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    async with chromium() as browser, Broker(broker_config(tmp_path_factory.mktemp("broker"))) as broker:
        settings = ConsoleSettings(endpoint=broker.address, listen_port=0, refresh_interval_ms=500,
                                   sample_interval_ms=1_000)
        async with ConsoleServer(settings) as console:
            yield Setup(broker, console, browser, screenshot_dir(tmp_path_factory.mktemp("screenshots")))


async def open_page(setup: Setup, path: str, shot: str | None = None) -> Any:
    page = await setup.browser.new_page(viewport={"width": 1400, "height": 900})
    response = await page.goto(setup.console.url + path)
    assert response is not None and response.status == 200, f"{path}: {response and response.status}"
    if shot:
        await page.screenshot(path=str(setup.shots / f"console-{shot}.png"), full_page=True)
    return page


async def test_every_page_opens_and_a_group_shows_the_lag_consumer_progress_shows(setup: Setup) -> None:
    address = setup.broker.address
    keys = await produce(address, TOPIC, 40, batch=4)
    collector = Collector()
    member = consumer(address, IDLE_GROUP, TOPIC, collector)
    async with member:
        await wait_until(lambda: len(collector.keys) >= len(keys), 20, "first round consumed")
    await produce(address, TOPIC, 12, batch=4)       # the group is gone: 12 messages of lag stay
    progress = await rocketq_json("admin", "consumer", "progress", "-g", IDLE_GROUP, "-n", address)
    assert progress["total_lag"] == 12

    page = await open_page(setup, f"/groups/{IDLE_GROUP}", "group")
    assert int(await page.inner_text("#total-lag")) == progress["total_lag"]
    shown = await page.locator("#group-queues td.lag").all_inner_texts()
    assert sorted(int(v) for v in shown) == sorted(q["lag"] for q in progress["queues"])
    assert await page.locator("#lag-chart svg").count() == 1
    await page.close()

    for path, shot, text in [("/", "cluster", "Cluster"), ("/brokers", "brokers", setup.broker.config.broker_name),
                             ("/topics", "topics", TOPIC), (f"/topics/{TOPIC}", "topic", "52"),
                             ("/groups", "groups", IDLE_GROUP), (f"/dlq/{IDLE_GROUP}", "dlq", "no dead letters"),
                             (f"/messages?topic={TOPIC}&key=nothing", "messages", "0 message(s)")]:
        page = await open_page(setup, path, shot)
        assert text in await page.inner_text("main"), path
        assert await page.locator("form.action button").count() >= (1 if path in ("/topics",) else 0)
        await page.close()


async def test_an_offset_reset_from_the_page_makes_the_consumers_consume_again(setup: Setup) -> None:
    address, topic, group = setup.broker.address, "reset-me", "resetters"
    keys = await produce(address, topic, 20, batch=4)
    collector = Collector()
    members: list[PushConsumer] = [consumer(address, group, topic, collector) for _ in range(2)]
    for member in members:
        await member.start()
    try:
        await wait_until(lambda: set(collector.keys) == set(keys), 20, "first round consumed")
        store = setup.broker.store
        assert store is not None
        await wait_until(lambda: all(setup.broker.offsets.query(group, topic, q) == store.get_max_offset(topic, q)
                                     for q in range(4)), 10, "offsets committed")
        page = await open_page(setup, f"/groups/{group}")
        await page.select_option("#reset-topic", topic)
        await page.select_option("#reset-to", "earliest")
        await page.click("#reset-button")
        await page.wait_for_selector("#reset-result")
        rows = await page.locator("#reset-result tr").all_inner_texts()
        assert len(rows) == 5 and all("\t0\t" in row.replace(" ", "") or row.startswith("topic") for row in rows)
        await page.screenshot(path=str(setup.shots / "console-reset.png"), full_page=True)
        await page.close()
        await wait_until(lambda: all(collector.keys[k] >= 2 for k in keys), 20, "consumed again after the reset")
    finally:
        for member in members:
            await member.shutdown()


async def test_a_dlq_resend_from_the_page_reaches_a_listener(setup: Setup) -> None:
    address = setup.broker.address
    remoting = RemotingClient()
    try:
        api = ClientAPI(remoting)
        await send(api, address, "refunds", b"refund 1", properties={"KEYS": "r-1", "UNIQ_KEY": "AB" * 16})
        pulled = await api.pull_message(address, pull_header(topic="refunds", max_msg_nums=1), 3_000)
        await api.consumer_send_msg_back(address, pulled.messages[0], "mend", 0, 0)   # max reconsume 0: DLQ
        dlq = await api.pull_message(address, pull_header(topic="%DLQ%mend", group="reader"), 3_000)
        (dead,) = dlq.messages
    finally:
        await remoting.close()
    received: list[MessageExt] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt], ctx: object) -> object:
        with lock:
            received.extend(m for m in msgs if m.properties.get("DLQ_RESENT_FROM") == dead.msg_id)
        return OK
    member = consumer(address, "resend-watchers", "refunds", listener,
                      consume_from_where="CONSUME_FROM_LAST_OFFSET")
    async with member:
        await wait_until(lambda: len(member.assigned_queues("refunds")) == 4, 10, "watcher owns the queues")
        page = await open_page(setup, "/dlq/mend", "dlq-mend")
        assert dead.msg_id in await page.inner_text("#dead-letters")
        await page.click(f"form.resend:has(input[value='{dead.msg_id}']) button")
        await page.wait_for_selector("#resent-count")
        assert await page.inner_text("#resent-count") == "1"
        await page.close()
        await wait_until(lambda: len(received) == 1, 20, "the resent message was consumed")
    assert received[0].body == dead.body


async def test_a_message_is_found_by_key_and_its_body_shown(setup: Setup) -> None:
    remoting = RemotingClient()
    try:
        await send(ClientAPI(remoting), setup.broker.address, "orders", b'{"order": 7, "total": 12.5}',
                   properties={"KEYS": "cust-7", "UNIQ_KEY": "C0FFEE" * 5 + "00"})
    finally:
        await remoting.close()
    page = await open_page(setup, "/messages")
    await page.fill("#search-topic", "orders")
    await page.fill("#search-key", "cust-7")
    await page.click("#search-button")
    await page.wait_for_selector("#result-count")
    assert await page.inner_text("#result-count") == "1 message(s)"
    assert "topic=orders" in page.url and "key=cust-7" in page.url     # the URL is the bookmark
    await page.click("#results a")
    await page.wait_for_selector("#body-json")
    assert '"total": 12.5' in await page.inner_text("#body-json")
    assert "7b 22 6f 72" in (await page.text_content("#body-hex") or "")   # in the closed Hex tab
    await page.screenshot(path=str(setup.shots / "console-message.png"), full_page=True)
    await page.close()


async def test_a_message_found_by_key_shows_its_trace_through_two_failures_and_the_dlq(setup: Setup) -> None:
    address = setup.broker.address
    member = PushConsumer("doomed", address, consume_from_where="CONSUME_FROM_FIRST_OFFSET", max_reconsume_times=2,
                          client_config=ClientConfig(persist_offset_interval_ms=100))
    member.subscribe("parcels")
    member.register_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.RECONSUME_LATER)
    remoting = RemotingClient()
    try:
        async with member, Producer("parcel-senders", address) as producer:
            message = Message("parcels", b"fragile")
            message.keys = "parcel-9"
            uniq = (await producer.send(message)).uniq_keys[0]
            # 1 delivery, 2 retries (300 + 400 ms), then the DLQ
            await trace_until(AdminAPI(remoting), address, lambda t: "to_dlq" in events_of(t), msg_id=uniq)
    finally:
        await remoting.close()
    page = await open_page(setup, "/messages?topic=parcels&key=parcel-9")
    await page.click("#results a")
    await page.wait_for_selector("table#trace")
    events = [await cell.inner_text() for cell in await page.query_selector_all("table#trace td.event")]
    assert events[:3] == ["sent", "stored", "delivered"] and events.count("sent_back") == 3
    assert events.count("retry_stored") == 2 and events.count("to_dlq") == 1
    assert "%DLQ%doomed" in await page.inner_text("table#trace")
    await page.screenshot(path=str(setup.shots / "console-trace.png"), full_page=True)
    await page.close()
