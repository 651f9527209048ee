"""The broker the demo talks to: one already listening, or `rocketq broker start` in a subprocess.

`BrokerSubprocess` starts on port 0 with a given store directory, learns its address from the
`listening on HOST:PORT` line on stderr, keeps draining stderr (showing errors), and stops with
SIGTERM, then a bounded wait, then SIGKILL."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import signal
import sys
from pathlib import Path
from types import TracebackType

from client.remoting.remoting_client import split_address

log = logging.getLogger(__name__)
DEFAULT_ENDPOINT = "127.0.0.1:10911"
_LISTENING = re.compile(rb"listening on (\S+):(\d+)")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


async def is_listening(address: str, timeout_s: float = 1.0) -> bool:
    """True when a TCP connect to `address` ("host:port") succeeds within `timeout_s`."""
    host, port = split_address(address)
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def broker_command() -> list[str]:
    """`rocketq broker start`: the console script next to this interpreter, else `python -m broker`."""
    script = Path(sys.executable).parent / "rocketq"
    if script.exists():
        return [str(script), "broker", "start"]
    return [sys.executable, "-m", "broker", "start"]


class BrokerSubprocess:
    def __init__(self, store_dir: Path, keep_lines: int = 50) -> None:
        self._store_dir = store_dir
        self._process: asyncio.subprocess.Process | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.address = ""
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("broker process is not started")
        return self._process.pid

    def tail(self, count: int = 10) -> str:
        """The last `count` lines the broker logged, joined by " | "."""
        return " | ".join(list(self._lines)[-count:]) or "(no output)"

    async def start(self) -> None:
        """Spawn the broker and return once it logged its address; raises RuntimeError (with the
        log tail) when it exits first or stays silent for `START_TIMEOUT_S`."""
        args = [*broker_command(), "--listen-port", "0", "--store-dir", str(self._store_dir)]
        self._process = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        assert self._process.stderr is not None
        stderr = self._process.stderr
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while True:
                    line = await stderr.readline()
                    if not line:
                        raise RuntimeError(f"broker exited before listening: {self.tail()}")
                    self._lines.append(line.decode(errors="replace").rstrip())
                    match = _LISTENING.search(line)
                    if match:
                        self.address = f"{match[1].decode()}:{int(match[2])}"
                        break
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"broker did not log 'listening on' within {START_TIMEOUT_S:.0f} s: "
                               f"{self.tail()}") from None
        except BaseException:
            await self.stop()
            raise
        self._drain_task = asyncio.create_task(self._drain(stderr))

    async def _drain(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self._lines.append(text)
            if " ERROR " in text or "Traceback" in text:
                log.warning("broker: %s", text)

    async def stop(self) -> int | None:
        """SIGTERM and wait (bounded by `STOP_TIMEOUT_S`), SIGKILL if it hangs; returns the exit code."""
        process = self._process
        if process is None:
            return None
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await process.wait()
            except TimeoutError:
                log.warning("broker pid %d ignored SIGTERM for %.0f s; killing it", process.pid, STOP_TIMEOUT_S)
                process.kill()
                await process.wait()
        drain, self._drain_task = self._drain_task, None
        if drain is not None:
            try:
                async with asyncio.timeout(5):
                    await drain
            except TimeoutError:
                drain.cancel()
                await asyncio.gather(drain, return_exceptions=True)
        self.exit_code = process.returncode
        if self.exit_code != 0:
            log.warning("broker pid %d exited with %s: %s", process.pid, self.exit_code, self.tail())
        return self.exit_code

    async def __aenter__(self) -> BrokerSubprocess:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
