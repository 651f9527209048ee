"""The console against a broker with authentication and authorization on, in headless Chromium:
pages send a visitor to /login; a wrong password is refused; the Super user sees the action
buttons and logs out; a Normal user sees none, and its POSTs (with its own valid CSRF token) are
refused with 403; no password ever appears in a URL or the cookie."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from broker.broker import Broker
from console.server import ConsoleServer
from console.state import ConsoleSettings
from tests.console.browser import chromium, screenshot_dir
from tests.security_helpers import ADMIN, add_user, secured_config

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Broker, ConsoleServer, Any]]:
    async with chromium() as browser, Broker(secured_config(tmp_path_factory.mktemp("broker"), lenient=True)) as broker:
        reads = ["Get", "List", "Sub"]
        await add_user(broker.address, "viewer", [("Topic:*", reads), ("Group:*", reads), ("Cluster", ["Get"])],
                       password="viewer-secret")
        async with ConsoleServer(ConsoleSettings(endpoint=broker.address, listen_port=0)) as console:
            yield broker, console, browser


async def log_in(browser: Any, url: str, user: str, password: str, target: str = "/topics") -> Any:
    page = await browser.new_page()
    await page.goto(url + target)
    assert "/login" in page.url, "a page without a session goes to the login page"
    await page.fill("#username", user)
    await page.fill("#password", password)
    await page.click("#login")
    await page.wait_for_load_state()
    return page


async def test_a_wrong_password_is_refused_and_the_super_user_logs_in_and_out(
        setup: tuple[Broker, ConsoleServer, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    _, console, browser = setup
    page = await log_in(browser, console.url, ADMIN.access_key, "not-the-password")
    assert "wrong user name or password" in await page.inner_text("#login-error")
    await page.close()
    page = await log_in(browser, console.url, ADMIN.access_key, ADMIN.secret_key)
    assert page.url.endswith("/topics") and await page.inner_text("#user") == ADMIN.access_key
    assert await page.locator("#create-topic button").count() == 1
    await page.screenshot(path=str(screenshot_dir(tmp_path_factory.mktemp("shots")) / "console-login.png"))
    cookies = await page.context.cookies()
    (cookie,) = [c for c in cookies if c["name"] == "rq_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and ADMIN.secret_key not in cookie["value"]
    await page.click("#logout")
    await page.wait_for_url("**/login")
    assert (await page.goto(console.url + "/groups")) is not None and "/login" in page.url
    await page.close()


async def test_a_normal_user_sees_no_action_and_its_posts_are_refused(setup: tuple[Broker, ConsoleServer, Any]) -> None:
    _, console, browser = setup
    page = await log_in(browser, console.url, "viewer", "viewer-secret")
    assert "(read-only)" in await page.inner_text("header")
    assert await page.locator("form.action").count() == 0
    for path in ("/groups/anyone", "/dlq/anyone"):
        await page.goto(console.url + path)
        assert await page.locator("form.action, form.resend").count() == 0, path
    token = await page.get_attribute("input[name=csrf_token]", "value")
    for path, form in [("/topics", {"topic": "sneaky", "queues": "4", "perm": "6"}),
                       ("/topics/sneaky/delete", {}), ("/groups/g/reset", {"topic": "t", "to": "earliest"}),
                       ("/dlq/g/resend", {"all": "1"})]:
        refused = await page.request.post(console.url + path, form={"csrf_token": token or "", **form})
        assert refused.status == 403, path
    no_token = await page.request.post(console.url + "/topics", form={"topic": "sneaky"})
    assert no_token.status == 403
    await page.close()
