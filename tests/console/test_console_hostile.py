"""The console against hostile requests (no browser; urllib over real HTTP against a real broker):
out-of-range and malformed form values are a 400, a forged or stale cookie is no session, a POST
without the session's CSRF token is a 403, a path out of /static is not served, and none of it
changes the cluster."""

from __future__ import annotations

import asyncio
import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator

import pytest

from broker.broker import Broker
from console.server import ConsoleServer
from console.state import ConsoleSettings


@pytest.fixture
async def console(broker: Broker) -> AsyncIterator[ConsoleServer]:
    async with ConsoleServer(ConsoleSettings(endpoint=broker.address, listen_port=0)) as server:
        yield server


class Browser:
    """urllib with a cookie jar; `fetch` returns (status, body) for any status."""

    def __init__(self) -> None:
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def fetch(self, url: str, form: dict[str, str] | None = None, cookie: str | None = None) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(url, data=data, headers={"Cookie": cookie} if cookie else {})
        try:
            with self.opener.open(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


async def test_hostile_form_values_cookies_and_paths_change_nothing(console: ConsoleServer, broker: Broker) -> None:
    browser = Browser()
    status, page = await asyncio.to_thread(browser.fetch, console.url + "/topics")
    assert status == 200
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert match is not None
    token = match.group(1)
    for form in [{"topic": "t1", "queues": "100000"}, {"topic": "t2", "queues": "-1"},
                 {"topic": "t3", "queues": "x"}, {"topic": "t4", "perm": "99"}, {"topic": "", "queues": "4"}]:
        status, _ = await asyncio.to_thread(browser.fetch, console.url + "/topics", {"csrf_token": token, **form})
        assert status == 400, form
    status, _ = await asyncio.to_thread(browser.fetch, console.url + "/topics",
                                        {"csrf_token": "0" * 32, "topic": "t5"})
    assert status == 403
    status, _ = await asyncio.to_thread(browser.fetch, console.url + "/groups/g/reset",
                                        {"csrf_token": token, "topic": "t", "to": "nowhere"})
    assert status == 400
    status, _ = await asyncio.to_thread(browser.fetch, console.url + "/groups/g/reset", {
        "csrf_token": token, "topic": "t", "to": "timestamp", "timestamp": "yesterday"})
    assert status == 400
    status, _ = await asyncio.to_thread(Browser().fetch, console.url + "/topics",
                                        {"csrf_token": token, "topic": "t6"}, "rq_console=forged.value.here")
    assert status == 403                       # a forged cookie is a new anonymous session, not the victim's
    for path in ("/static/../sessions.py", "/static/%2e%2e/sessions.py"):
        status, body = await asyncio.to_thread(browser.fetch, console.url + path)
        assert status == 404 and "COOKIE_NAME" not in body, path
    assert all(broker.topics.get(f"t{i}") is None for i in range(1, 7))
