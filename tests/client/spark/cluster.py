"""`SparkCluster`: a name server and brokers broker-a, broker-b as subprocesses (so a broker can be
SIGKILLed), driven from the synchronous thread Spark tests run in through an event loop of its own."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from broker.process import BrokerSubprocess
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.errors import TopicNotExist
from tests.helpers import free_port

T = TypeVar("T")
BROKERS = ("broker-a", "broker-b")
TIMEOUT_S = 60.0


class SparkCluster:
    """Start with `start()`; `namesrv` is the name server's address, `brokers` the subprocesses by
    broker name (fixed ports: a restart keeps the address). `extra` settings go to every broker."""

    def __init__(self, root: Path, extra: dict[str, str] | None = None) -> None:
        self._root, self._extra = root, dict(extra or {})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="spark-cluster", daemon=True)
        self.namesrv = ""
        self._namesrv: BrokerSubprocess | None = None
        self.brokers: dict[str, BrokerSubprocess] = {}

    def run(self, work: Coroutine[Any, Any, T], timeout_s: float = TIMEOUT_S) -> T:
        """`work` on the cluster's loop, from a test's thread."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout_s)

    def call(self, work: Callable[[ClientAPI], Awaitable[T]]) -> T:
        async def main() -> T:
            remoting = RemotingClient()
            try:
                return await work(ClientAPI(remoting))
            finally:
                await remoting.close()

        return self.run(main())

    def _broker(self, name: str, port: int) -> BrokerSubprocess:
        return BrokerSubprocess(self._root / name, listen_port=port, settings={
            "broker_name": name, "namesrv_addr": self.namesrv, "register_name_server_period_ms": "500",
            "persist_interval_ms": "200", "store.commit_log_segment_bytes": "1048576", **self._extra})

    def start(self) -> None:
        self._thread.start()
        self._namesrv = BrokerSubprocess(None, command=[sys.executable, "-m", "namesrv"])
        self.run(self._namesrv.start())
        self.namesrv = self._namesrv.address
        for name in BROKERS:
            self.brokers[name] = self._broker(name, free_port())
            self.run(self.brokers[name].start())

    def kill(self, name: str) -> None:
        """SIGKILL broker `name` and collect it."""
        broker = self.brokers[name]
        broker.kill()
        self.run(broker.stop())

    def restart(self, name: str) -> None:
        """Start broker `name` again on its port and store (after `kill`)."""
        old = self.brokers[name]
        self.brokers[name] = self._broker(name, old.listen_port)
        self.run(self.brokers[name].start())

    def create_topic(self, topic: str, queues: int) -> None:
        """`topic` with `queues` queues on every broker; returns once the name server routes both."""
        async def work(api: ClientAPI) -> None:
            for broker in self.brokers.values():
                await api.create_topic(broker.address, topic, queue_nums=queues)
            deadline = time.monotonic() + TIMEOUT_S
            while await self._routed(api, topic) != sorted(self.brokers):
                assert time.monotonic() < deadline, f"{topic} not routed to both brokers"
                await asyncio.sleep(0.05)

        self.call(work)

    async def _routed(self, api: ClientAPI, topic: str) -> list[str]:
        try:
            return sorted(q.broker_name for q in (await api.get_route_info(self.namesrv, topic)).queue_datas)
        except TopicNotExist:
            return []

    def stop(self) -> None:
        for broker in self.brokers.values():
            self.run(broker.stop())
        if self._namesrv is not None:
            self.run(self._namesrv.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(TIMEOUT_S)
        self._loop.close()


def running_cluster(root: Path, extra: dict[str, str] | None = None) -> Iterator[SparkCluster]:
    """A started `SparkCluster`, stopped afterwards (for fixtures)."""
    cluster = SparkCluster(root, extra)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
