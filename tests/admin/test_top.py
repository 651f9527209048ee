"""`rocketq top` on a real terminal: run under tmux against a real broker, its screen captured and
checked, then `q` pressed and the command gone."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from broker.broker import Broker
from client.api import ClientAPI
from tests.helpers import pull_header, send
from tests.system_tools import require_program

REPO = Path(__file__).resolve().parents[2]


async def _tmux(tmux: str, socket: str, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(tmux, "-L", socket, *args, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
    out, _ = await process.communicate()
    return int(process.returncode or 0), out.decode(errors="replace")


async def test_top_shows_lag_per_queue_and_q_quits(broker: Broker, client_api: ClientAPI) -> None:
    tmux = require_program("tmux", "tmux")
    for body in (b"1", b"2", b"3", b"4", b"5"):
        await send(client_api, broker.address, "watched", body, queue_id=1)
    await client_api.pull_message(broker.address, pull_header(topic="watched", group="watchers", queue_id=1,
                                                              max_msg_nums=1), 3_000)   # the group exists
    await client_api.update_consumer_offset(broker.address, "watchers", "watched", 1, 2)
    socket = f"rocketq-top-{os.getpid()}"
    command = f"cd {REPO} && {sys.executable} -m rocketq top --endpoints {broker.address}"
    code, out = await _tmux(tmux, socket, "new-session", "-d", "-s", "top", "-x", "160", "-y", "40", command)
    assert code == 0, out
    screen = ""
    try:
        async with asyncio.timeout(30):
            while not ("watchers" in screen and "total lag 3" in screen):
                await asyncio.sleep(0.2)
                _, screen = await _tmux(tmux, socket, "capture-pane", "-p", "-t", "top")
        rows = [line for line in screen.splitlines() if "watchers" in line and "watched" in line]
        assert len(rows) == 4, screen
        assert re.search(r"watchers\s*│\s*watched\s*│\s*1\s*│\s*3\s*│", rows[1]), screen
        assert "held pulls 0" in screen and "(q quits)" in screen
        await _tmux(tmux, socket, "send-keys", "-t", "top", "q")
        async with asyncio.timeout(10):
            while (await _tmux(tmux, socket, "has-session", "-t", "top"))[0] == 0:
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"rocketq top screen:\n{screen}") from None
    finally:
        await _tmux(tmux, socket, "kill-server")
