"""`rocketq top` on a real terminal: run under tmux against a real broker, its screen captured and
checked, then `q` pressed and the command gone."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from admin.top_view import SORTS, TopRow, column_widths, next_sort, sort_rows
from broker.broker import Broker
from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, MessageExt
from client.api import ClientAPI
from tests.admin.cli_runner import rocketq
from tests.client.test_push_consumer import consumer
from tests.helpers import pull_header, send, wait_until
from tests.system_tools import require_program

REPO = Path(__file__).resolve().parents[2]


async def _tmux(tmux: str, socket: str, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(tmux, "-L", socket, *args, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
    out, _ = await process.communicate()
    return int(process.returncode or 0), out.decode(errors="replace")


class Screen:
    """`rocketq top` running in a tmux session: wait for its screen, press keys."""

    def __init__(self, tmux: str, socket: str) -> None:
        self.tmux, self.socket, self.text = tmux, socket, ""

    async def until(self, shown: Callable[[str], bool], timeout_s: float = 30) -> str:
        """The screen once `shown(screen)` holds; fails showing the last screen after `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                while not shown(self.text):
                    await asyncio.sleep(0.2)
                    _, self.text = await _tmux(self.tmux, self.socket, "capture-pane", "-p", "-t", "top")
        except TimeoutError:
            raise AssertionError(f"rocketq top screen:\n{self.text}") from None
        return self.text

    async def press(self, key: str) -> None:
        await _tmux(self.tmux, self.socket, "send-keys", "-t", "top", key)

    async def quits_on_q(self) -> None:
        await self.press("q")
        async with asyncio.timeout(10):
            while (await _tmux(self.tmux, self.socket, "has-session", "-t", "top"))[0] == 0:
                await asyncio.sleep(0.1)


@asynccontextmanager
async def top_in_tmux(address: str, columns: int) -> AsyncIterator[Screen]:
    tmux = require_program("tmux", "tmux")
    socket = f"rocketq-top-{os.getpid()}-{columns}"
    command = f"cd {REPO} && {sys.executable} -m rocketq top --endpoints {address}"
    code, out = await _tmux(tmux, socket, "new-session", "-d", "-s", "top", "-x", str(columns), "-y", "40", command)
    assert code == 0, out
    try:
        yield Screen(tmux, socket)
    finally:
        await _tmux(tmux, socket, "kill-server")


async def test_top_shows_lag_per_queue_and_q_quits(broker: Broker, client_api: ClientAPI) -> None:
    for body in (b"1", b"2", b"3", b"4", b"5"):
        await send(client_api, broker.address, "watched", body, queue_id=1)
    await client_api.pull_message(broker.address, pull_header(topic="watched", group="watchers", queue_id=1,
                                                              max_msg_nums=1), 3_000)   # the group exists
    await client_api.update_consumer_offset(broker.address, "watchers", "watched", 1, 2)
    async with top_in_tmux(broker.address, 160) as screen:
        text = await screen.until(lambda s: "watchers" in s and "total lag 3" in s)
        rows = [line for line in text.splitlines() if "watchers" in line and "watched" in line]
        assert len(rows) == 4, text
        assert re.search(r"watchers\s*│\s*watched\s*│\s*1\s*│\s*3\s*│", rows[0]), "the lagging queue first"
        assert "held pulls 0" in text and "q quits" in text
        await screen.quits_on_q()


async def test_at_80_columns_the_numbers_stay_and_the_owner_is_cut_and_s_cycles_the_sort(
        broker: Broker, client_api: ClientAPI) -> None:
    release = threading.Event()

    def stuck(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        release.wait(30)                # holds the queue's committed offset at its first message
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    await client_api.create_topic(broker.address, "watched", queue_nums=2)
    for body in (b"1", b"2", b"3"):
        await send(client_api, broker.address, "watched", body, queue_id=1)
    watcher = consumer(broker.address, "watchers", "watched", stuck)
    await watcher.start()
    try:
        await wait_until(lambda: len(watcher.assigned_queues("watched")) == 2, 10, "queues assigned")
        client_id = str(watcher.client_id)
        async with top_in_tmux(broker.address, 80) as screen:
            text = await screen.until(lambda s: "total lag 3" in s and "…" in s)
            rows = [line for line in text.splitlines() if "│ watchers" in line]
            assert len(rows) == 3, text         # watched 0, watched 1, %RETRY%watchers 0
            lagging = next(row for row in rows if re.search(r"│\s*1\s*│\s*3\s*│", row))
            assert rows[0] == lagging, "sorted by lag, largest first"
            assert re.search(r"│\s*(-|\d+\.\d)\s*│\s*(-|\d+\.\d)\s*│", lagging), "in/s and out/s shown"
            assert client_id not in text and client_id[:6] in lagging and "…" in lagging, "the owner is cut"
            assert all(len(line) <= 80 for line in text.splitlines())
            assert "sort: lag" in text
            await screen.press("s")
            await screen.until(lambda s: "sort: tps" in s)
            await screen.press("s")
            text = await screen.until(lambda s: "sort: topic" in s)
            rows = [line for line in text.splitlines() if "│ watchers" in line]
            assert "%RETRY%watchers" in rows[0], "topic order: %RETRY%watchers before watched"
            await screen.quits_on_q()
    finally:
        release.set()
        await watcher.shutdown()


def test_sort_orders_and_what_is_cut_on_a_narrow_screen() -> None:
    rows = [TopRow("g", "b", 0, 5, 0, 1.0, 2.0, "o"), TopRow("g", "a", 1, 9, 0, 1.0, 1.0, "o"),
            TopRow("f", "c", 0, 0, 0, None, 3.0, "o"), TopRow("f", "c", 1, 0, 0, None, None, "o")]
    assert [(r.topic, r.queue_id) for r in sort_rows(rows, "lag")] == [("a", 1), ("b", 0), ("c", 0), ("c", 1)]
    assert [(r.topic, r.queue_id) for r in sort_rows(rows, "tps")] == [("c", 0), ("b", 0), ("a", 1), ("c", 1)]
    assert [(r.topic, r.queue_id) for r in sort_rows(rows, "topic")] == [("a", 1), ("b", 0), ("c", 0), ("c", 1)]
    assert [(r.group, r.topic) for r in sort_rows(rows, "group")] == [("f", "c"), ("f", "c"), ("g", "a"), ("g", "b")]
    assert [next_sort(s) for s in SORTS] == ["tps", "topic", "group", "lag"]

    cells = [["a-group", "orders", "12", "123456", "1h02m03s", "1234.5", "1234.5", "192.0.2.2@6423#6537272776318"]]
    natural = column_widths(cells, 500)
    narrow = column_widths(cells, 80)
    assert sum(narrow) + 3 * len(narrow) + 1 <= 80
    assert narrow[2:7] == natural[2:7], "queue, lag, lag time, in/s, out/s keep their width"
    assert narrow[7] < natural[7] and narrow[:2] == natural[:2], "only the owner is cut"
    tiny = column_widths(cells, 60)
    assert tiny[2:7] == natural[2:7] and [tiny[0], tiny[1], tiny[7]] == [6, 6, 6], "then topic and group"


async def test_sort_option_orders_the_rows(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "alpha", queue_nums=1)
    await client_api.create_topic(broker.address, "zeta", queue_nums=1)
    for topic, count in (("alpha", 2), ("zeta", 4)):
        for _ in range(count):
            await send(client_api, broker.address, topic, b"x")
        await client_api.update_consumer_offset(broker.address, "readers", topic, 0, 0)
    await client_api.pull_message(broker.address, pull_header(topic="alpha", group="readers", max_msg_nums=1),
                                  3_000)                                 # the group exists
    by_lag = await rocketq("top", "--iterations", "1", "-n", broker.address)
    by_topic = await rocketq("top", "--iterations", "1", "--sort", "topic", "-n", broker.address)
    assert by_lag.exit_code == 0 and by_topic.exit_code == 0, by_lag.output + by_topic.output
    assert "sort: lag" in by_lag.output and "sort: topic" in by_topic.output
    assert by_lag.output.index("zeta") < by_lag.output.index("alpha"), by_lag.output
    assert by_topic.output.index("alpha") < by_topic.output.index("zeta"), by_topic.output
    wrong = await rocketq("top", "--sort", "size", "-n", broker.address)
    assert wrong.exit_code == 2 and "lag" in wrong.output
