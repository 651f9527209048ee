"""The broker's exposition as a real Prometheus server sees it: `promtool check metrics` accepts it,
and a Prometheus scraping the running broker answers queries for the messages-in counter and the
consumer lag through its HTTP API."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from tests.conftest import broker_config
from tests.helpers import free_port, send
from tests.system_tools import require_program


@pytest.fixture
async def scraped_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(broker_config(tmp_path, metrics_port=free_port())) as broker:
        yield broker


async def test_promtool_accepts_the_exposition(scraped_broker: Broker, client_api: ClientAPI) -> None:
    promtool = require_program("promtool", "prometheus")
    await send(client_api, scraped_broker.address, "pt", b"x")
    await client_api.update_consumer_offset(scraped_broker.address, "ptg", "pt", 0, 0)
    text = await scraped_broker.metrics.render()
    checked = await asyncio.to_thread(subprocess.run, [promtool, "check", "metrics"], input=text,
                                      capture_output=True, timeout=60)
    assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()


def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return dict(json.loads(response.read()))


def _query(port: int, expression: str) -> list[float]:
    """Values of an instant query (empty while Prometheus has not scraped it yet)."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    answer = _get_json(url)
    assert answer["status"] == "success", answer
    data = answer["data"]
    assert isinstance(data, dict)
    return [float(item["value"][1]) for item in data["result"]]


async def _wait_for_value(port: int, expression: str, expected: float, timeout_s: float = 60.0) -> None:
    """Ask Prometheus until `expression` has the value `expected` (bounded; it scrapes every second)."""
    seen: list[float] = []
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    seen = await asyncio.to_thread(_query, port, expression)
                except OSError:
                    seen = []
                if seen == [expected]:
                    return
                await asyncio.sleep(0.25)
    except TimeoutError:
        raise AssertionError(f"{expression} never became {expected} in Prometheus (last: {seen})") from None


async def test_a_real_prometheus_scrapes_messages_in_and_consumer_lag(
        tmp_path: Path, scraped_broker: Broker, client_api: ClientAPI) -> None:
    prometheus = require_program("prometheus", "prometheus")
    for body in (b"1", b"2", b"3", b"4"):
        await send(client_api, scraped_broker.address, "prom", body)
    await client_api.update_consumer_offset(scraped_broker.address, "promg", "prom", 0, 1)
    web_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: rocketq\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{scraped_broker.metrics_port}']}}]\n")
    process = await asyncio.create_subprocess_exec(
        prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web_port}", "--log.level=warn",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        await _wait_for_value(web_port, 'rocketmq_messages_in_total{topic="prom"}', 4)
        await _wait_for_value(web_port, 'rocketmq_consumer_lag_messages{consumer_group="promg",topic="prom"}', 3)
        await _wait_for_value(web_port, 'up{job="rocketq"}', 1)
    finally:
        process.terminate()
        try:
            async with asyncio.timeout(20):
                await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
