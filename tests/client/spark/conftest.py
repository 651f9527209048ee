"""Fixtures of the Spark tests: one `local[2]` SparkSession for the whole session, and a real broker
on port 0 with a `tmp_path` store running in a thread of this process (Spark calls block the test's
thread, so the broker needs an event loop of its own)."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from pyspark.sql import SparkSession

from broker.broker import Broker
from client.api import ClientAPI, SendResult
from client.spark.queues import run_on_private_loop
from client.spark.session import local_session
from conf.broker import BrokerConfig
from protocol.headers import SendBatchMessageRequestHeader
from protocol.message import Message, encode_batch_body
from tests.client.spark.cluster import SparkCluster, running_cluster
from tests.conftest import broker_config

T = TypeVar("T")
START_TIMEOUT_S = 30.0


class BrokerThread:
    """`Broker` running on its own event loop in a daemon thread; `address` once started. `config`
    defaults to `broker_config(store_dir)`."""

    def __init__(self, store_dir: Path, config: BrokerConfig | None = None) -> None:
        self._config = config or broker_config(store_dir)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="broker", daemon=True)
        self.address = ""

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            async with Broker(self._config) as broker:
                self.address = broker.address
                self._ready.set()
                await self._stop.wait()

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._error is not None:
            raise RuntimeError(f"broker did not start: {self._error!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT_S)


def java_missing() -> str | None:
    """Why Spark cannot start here (it runs on a JVM), or None when a `java` is at hand."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return None
    if shutil.which("java") is None:
        return "Spark needs a Java runtime: no `java` on PATH and no usable JAVA_HOME"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    reason = java_missing()
    if reason is not None:
        pytest.skip(reason)
    # local[2, 2]: a failed task is retried once, as spark.task.maxFailures=2 does on a cluster
    session = local_session("rocketq-tests", master="local[2,2]",
                            conf={"spark.sql.streaming.stopTimeout": "10s", "spark.driver.memory": "1g",
                                  "spark.task.maxFailures": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A name server and brokers broker-a, broker-b (subprocesses), exactly-once sends on
    (`store.dedup_window_ms`); the brokers run this checkout (PYTHONPATH)."""
    root = str(Path(__file__).parents[3])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    yield from running_cluster(tmp_path_factory.mktemp("cluster"), {"store.dedup_window_ms": "600000"})


@pytest.fixture
def broker_thread(tmp_path: Path) -> Iterator[BrokerThread]:
    running = BrokerThread(tmp_path)
    running.start()
    yield running
    running.stop()


def call(work: Callable[[ClientAPI], Awaitable[T]]) -> T:
    """Run `work(api)` from a test's (synchronous) thread."""
    return run_on_private_loop(work)


def send_messages(address: str, topic: str, messages: list[Message], queue_id: int) -> SendResult:
    """All of `messages` to one queue, in one SEND_BATCH_MESSAGE per 64."""
    async def work(api: ClientAPI) -> SendResult:
        result = None
        for low in range(0, len(messages), 64):
            header = SendBatchMessageRequestHeader(producer_group="spark-tests", topic=topic, queue_id=queue_id)
            result = await api.send_batch(address, header, encode_batch_body(messages[low:low + 64]))
        assert result is not None
        return result

    return call(work)


def create_topic(address: str, topic: str, queues: int) -> None:
    call(lambda api: api.create_topic(address, topic, queue_nums=queues))
