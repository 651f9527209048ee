"""`ConsoleServer`: the console's web server (uvicorn serving `console.app.create_app`) on the
running asyncio loop, beside the admin client it talks through, and the lag sampler.

    async with ConsoleServer(ConsoleSettings(endpoint="127.0.0.1:9876")) as console:
        print(console.url)        # http://127.0.0.1:8080 (port 0: a free port, known here)

`start()` returns once the socket listens (so `port` is known); `stop()` ends open connections
within `shutdown_timeout_ms` and stops the sampler. Raises `OSError` when the port is taken."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from types import TracebackType

import uvicorn

from console.app import create_app
from console.state import ConsoleSettings, ConsoleState
from protocol.errors import MQError

log = logging.getLogger(__name__)


class _QuietServer(uvicorn.Server):
    """uvicorn's server without its signal handlers: the console's owner (`rocketq console start`,
    a test, a broker process) decides what a signal does and calls `ConsoleServer.stop`."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:    # type: ignore[override]
        return contextlib.nullcontext()


class ConsoleServer:
    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.state = ConsoleState(settings)
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def url(self) -> str:
        host = self.settings.listen_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.settings.listen_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.settings.listen_host, self.settings.listen_port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(create_app(self.state), lifespan="off", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=max(1, self.settings.shutdown_timeout_ms // 1000),
                                server_header=False)
        self._server = _QuietServer(config)
        self._tasks = [asyncio.create_task(self._server.serve(sockets=[sock]), name="console-http"),
                       asyncio.create_task(self._sample(), name="console-lag-sampler")]
        deadline = time.monotonic() + 10
        while not self._server.started:
            if self._tasks[0].done() or time.monotonic() > deadline:
                await self._tasks[0]                 # raises what ended it
                raise OSError(f"the console did not start on {self.url}")
            await asyncio.sleep(0.01)

    async def _sample(self) -> None:
        interval_s = self.settings.sample_interval_ms / 1000
        while True:
            try:
                await self.state.sample_lag()
            except (MQError, OSError, TimeoutError) as exc:
                log.debug("lag sample failed: %s", exc)
            await asyncio.sleep(interval_s)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        http, others = (self._tasks[0], self._tasks[1:]) if self._tasks else (None, [])
        for task in others:
            task.cancel()
        for task in others:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if http is not None:
            try:
                await asyncio.wait_for(http, self.settings.shutdown_timeout_ms / 1000 + 1)
            except TimeoutError:
                log.warning("console web server did not stop within %d ms; cancelled",
                            self.settings.shutdown_timeout_ms)
        self._tasks = []
        await self.state.close()

    async def __aenter__(self) -> ConsoleServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
