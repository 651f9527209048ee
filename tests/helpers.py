"""Test helpers: request builders and bounded waits (never sleeps used as synchronisation)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable

from broker.broker import Broker
from chaos.ha_cluster import free_port_pair
from client.api import ClientAPI, SendResult
from protocol.codes import PullSysFlag
from protocol.command import RemotingCommand
from protocol.frame import FrameDecoder
from protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader


def pull_header(*, topic: str = "t", queue_id: int = 0, queue_offset: int = 0, group: str = "g",
                max_msg_nums: int = 32, suspend_timeout_ms: int = 0, sys_flag: int | None = None,
                subscription: str = "*", commit_offset: int = 0) -> PullMessageRequestHeader:
    """A pull that carries its own subscription (SUBSCRIPTION flag), so no heartbeat is needed;
    SUSPEND is set when `suspend_timeout_ms` > 0."""
    if sys_flag is None:
        sys_flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_timeout_ms > 0 else 0)
    return PullMessageRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id,
                                    queue_offset=queue_offset, max_msg_nums=max_msg_nums, sys_flag=sys_flag,
                                    commit_offset=commit_offset, suspend_timeout_ms=suspend_timeout_ms,
                                    sub_version=0, subscription=subscription, expression_type="TAG")


async def send(api: ClientAPI, address: str, topic: str = "t", body: bytes = b"x", *, queue_id: int = 0,
               tags: str | None = None, properties: dict[str, str] | None = None) -> SendResult:
    props = dict(properties or {})
    if tags is not None:
        props["TAGS"] = tags
    header = SendMessageRequestHeader(producer_group="pg", topic=topic, queue_id=queue_id, flag=0,
                                      born_timestamp=0, properties=props)
    return await api.send_message(address, header, body)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, and the one above it (a master's default `ha_listen_port`
    is `listen_port + 1`), for an endpoint whose port 0 means "off" (`metrics_port`) or a broker
    restarted on its port; below the kernel's ephemeral range (`chaos.ha_cluster.free_port_pair`)."""
    return free_port_pair()


def scrape_metrics(port: int) -> str:
    """The text of http://127.0.0.1:PORT/metrics; blocking, so call it with `asyncio.to_thread`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll `predicate` on every loop iteration until true, failing after `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.001)
    assert predicate(), what


async def held_pulls(broker: Broker, *, topic: str, count: int, queue_id: int = 0, timeout_s: float = 5.0) -> None:
    """Wait (bounded) until the broker holds `count` pulls on (topic, queue_id)."""
    hold = broker.hold_service
    assert hold is not None
    await wait_until(lambda: len(hold.held.get((topic, queue_id), {})) >= count, timeout_s,
                     f"{count} held pulls on {topic}:{queue_id}")


async def read_commands(reader: asyncio.StreamReader, count: int) -> list[RemotingCommand]:
    """The next `count` commands from a raw connection (more if they came in the same read);
    fails if the peer closes first. Callers bound it with `asyncio.timeout`."""
    decoder, commands = FrameDecoder(), list[RemotingCommand]()
    while len(commands) < count:
        chunk = await reader.read(65_536)
        assert chunk, f"the connection closed after {len(commands)} of {count} commands"
        commands += decoder.feed(chunk)
    return commands
