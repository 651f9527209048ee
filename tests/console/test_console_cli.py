"""`rocketq console start` as a process: it prints its URL, serves the pages against a real broker,
and stops on SIGTERM (exit 0); a taken port is one line and exit 2. Plus the pure parts: the lag
ring stays bounded, and the chart is well-formed SVG for any samples."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from broker.broker import Broker
from console.lag_history import LagHistory, lag_chart_svg

ROOT = Path(__file__).resolve().parents[2]


def _console(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "rocketq", "console", "start", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


async def test_console_start_serves_the_pages_and_stops_on_sigterm(broker: Broker) -> None:
    with _console("--endpoints", broker.address, "--listen-port", "0") as process:
        try:
            await _serves_then_stops(process, broker)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


async def _serves_then_stops(process: subprocess.Popen[str], broker: Broker) -> None:
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 20)
    assert line.startswith("rocketq console on http://127.0.0.1:"), line
    url = line.split()[3]
    status, body = await asyncio.to_thread(_get, url + "/brokers")
    assert status == 200 and broker.config.broker_name in body
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(asyncio.to_thread(process.wait), 15) == 0


async def test_a_taken_port_is_one_line_and_exit_2(broker: Broker) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with _console("--endpoints", broker.address, "--listen-port", str(taken.getsockname()[1])) as process:
            _, err = await asyncio.wait_for(asyncio.to_thread(process.communicate), 20)
    assert process.returncode == 2 and err.startswith("rocketq admin: cannot serve on 127.0.0.1:"), err


@given(st.lists(st.tuples(st.text(min_size=1, max_size=3), st.integers(0, 10_000), st.integers(-5, 10**9)),
                max_size=200))
def test_the_lag_history_stays_bounded_and_in_order(records: list[tuple[str, int, int]]) -> None:
    history = LagHistory(max_points=5, max_groups=3)
    for group, at_ms, lag in records:
        history.record(group, at_ms, lag)
    assert len(history.groups()) <= 3
    for group in history.groups():
        kept = history.samples(group)
        mine = [(at, max(0, lag)) for g, at, lag in records if g == group]
        assert kept == mine[-len(kept):] and len(kept) <= 5


@given(st.lists(st.tuples(st.integers(0, 4_000_000), st.integers(0, 10**12)), max_size=50))
def test_the_chart_is_well_formed_svg_for_any_samples(samples: list[tuple[int, int]]) -> None:
    svg = ElementTree.fromstring(lag_chart_svg(sorted(samples), 3_600_000))
    assert svg.tag.endswith("svg")
    inside = [s for s in samples if 0 <= s[0] <= 3_600_000]
    assert (svg.find("{http://www.w3.org/2000/svg}polyline") is not None) == bool(inside)
