"""The console in headless Chromium: the brokers page's message rates (the out rate after consuming
is what GET_BROKER_RUNTIME_INFO reports, as `rocketq admin broker status --json` shows it), and the
message search by store time range (only the messages of the range; an empty state for a range
with none; a clear 400 for an end before the start or an out-of-range time, never a 500)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
import pytest_asyncio

from broker.broker import Broker
from client import Message, Producer
from console.server import ConsoleServer
from console.state import ConsoleSettings
from tests.admin.cli_runner import rocketq_json
from tests.client.test_push_consumer import Collector, consumer, produce
from tests.conftest import broker_config
from tests.console.browser import chromium, screenshot_dir
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOPIC = "timed"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    async with chromium() as running:
        yield running


async def test_the_brokers_page_shows_the_out_rate_the_admin_api_reports(
        browser: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    async with Broker(broker_config(tmp_path_factory.mktemp("rates"))) as broker, \
            ConsoleServer(ConsoleSettings(endpoint=broker.address, listen_port=0)) as console:
        keys = await produce(broker.address, "rated", 30, batch=10)
        collector = Collector()
        async with consumer(broker.address, "raters", "rated", collector):
            await wait_until(lambda: set(collector.keys) == set(keys), 20, "all consumed")
        # Nothing moves now: each reading's rate is (total since the start) / (time since the start)
        before = await rocketq_json("admin", "broker", "status", "--endpoints", broker.address)
        page = await browser.new_page()
        await page.goto(console.url + "/brokers")
        shown_out = float(await page.inner_text("#brokers tr.broker td.out-rate"))
        shown_in = float(await page.inner_text("#brokers tr.broker td.in-rate"))
        after = await rocketq_json("admin", "broker", "status", "--endpoints", broker.address)
        await page.screenshot(path=str(screenshot_dir(tmp_path_factory.mktemp("shots")) / "console-rates.png"))
        await page.close()
    assert before["msg_get_total"] == after["msg_get_total"] == 30 and after["msg_put_total"] == 30
    assert shown_out > 0 and shown_in > 0
    # shown with one decimal, read between the two admin readings (the rate only falls meanwhile)
    assert after["get_tps"] - 0.051 <= shown_out <= before["get_tps"] + 0.051
    assert after["put_tps"] - 0.051 <= shown_in <= before["put_tps"] + 0.051


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def console(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ConsoleServer]:
    async with Broker(broker_config(tmp_path_factory.mktemp("search"))) as broker, \
            ConsoleServer(ConsoleSettings(endpoint=broker.address, listen_port=0)) as server:
        yield server


def _local(epoch_s: int) -> str:
    """What a datetime-local input holds for `epoch_s` (the console reads it as local time)."""
    return datetime.fromtimestamp(epoch_s).strftime("%Y-%m-%dT%H:%M:%S")


async def _send(address: str, keys: list[str]) -> None:
    async with Producer("timers", address) as producer:
        for key in keys:
            message = Message(TOPIC, key.encode())
            message.keys = key
            await producer.send(message)


async def _search(browser: Any, url: str, begin: str, end: str) -> tuple[Any, int]:
    """The messages page after searching `TOPIC` from `begin` to `end` through the form."""
    page = await browser.new_page(viewport={"width": 1400, "height": 900})
    await page.goto(url + "/messages")
    await page.fill("#search-topic", TOPIC)
    await page.fill("#search-begin", begin)
    await page.fill("#search-end", end)
    async with page.expect_navigation() as navigation:
        await page.click("#search-button")
    response = await navigation.value
    return page, response.status


async def test_a_time_range_search_shows_only_the_messages_of_that_range(browser: Any, console: ConsoleServer) -> None:
    address = console.settings.endpoint
    first_ms = int(time.time() * 1000)
    await _send(address, ["early-1", "early-2", "early-3"])
    boundary_s = int(time.time()) + 1           # every early message was stored before this second
    await wait_until(lambda: time.time() >= boundary_s + 1, 5, "the clock passed the boundary")
    await _send(address, ["late-1", "late-2"])
    last_s = int(time.time()) + 1

    for begin, end, expected in [(first_ms // 1000, boundary_s, {"early-1", "early-2", "early-3"}),
                                 (boundary_s + 1, last_s, {"late-1", "late-2"})]:
        page, status = await _search(browser, console.url, _local(begin), _local(end))
        assert status == 200 and "begin=" in page.url and "end=" in page.url    # the URL is the bookmark
        assert await page.inner_text("#result-count") == f"{len(expected)} message(s)"
        shown = await page.locator("#results tr td:nth-child(6)").all_inner_texts()
        assert set(shown) == expected, (begin, end)
        await page.close()

    page, status = await _search(browser, console.url, "2001-01-01T00:00:00", "2001-01-02T00:00:00")
    assert status == 200 and await page.inner_text("#result-count") == "0 message(s)"
    assert "none of timed was stored in that time range" in await page.inner_text("#no-results")
    await page.close()


async def test_a_hostile_time_range_is_a_clear_400(browser: Any, console: ConsoleServer) -> None:
    page, status = await _search(browser, console.url, "2030-01-02T00:00:00", "2030-01-01T00:00:00")
    assert status == 400
    assert await page.inner_text("#search-problem") == "the end of the time range is before its start"
    assert await page.locator("#results").count() == 0
    for query, problem in [("begin=99999999999999999999", "between 1970-01-01 and 9999-12-31"),
                           ("begin=" + "9" * 5000, "epoch milliseconds"),
                           ("end=-5", "epoch milliseconds"), ("begin=yesterday", "not 'yesterday'"),
                           ("begin=0001-01-01T00:00:00", "between 1970-01-01 and 9999-12-31"),
                           ("begin=1000&end=999", "before its start")]:
        response = await page.goto(f"{console.url}/messages?topic={TOPIC}&{query}")
        assert response is not None and response.status == 400, query
        assert problem in await page.inner_text("#search-problem"), query
    await page.close()
