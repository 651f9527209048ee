"""`BrokerProcess`: a broker in a subprocess on port 0, so its CPU and RSS can be measured apart
from the client (psutil) and it runs on its own core.

    async with BrokerProcess(store_dir, settings={"store.flush_disk_type": "ASYNC_FLUSH"}) as broker:
        ... broker.address ... broker.usage() ...

The address comes from the `listening on HOST:PORT` log line on stderr; stderr is drained by a task
for the whole run (the last lines are kept for error messages). Stop is SIGTERM, then a bounded wait,
then SIGKILL.

With RQ_BENCH_PYSPY=DIR in the environment, `py-spy record` (installed next to this
interpreter) samples the broker for its whole life and writes collapsed stacks to DIR/broker-PID.txt
(investigation only: it costs the broker a little CPU)."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(rb"listening on (\S+):(\d+)")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class Usage:
    """A sample of the broker process: cumulative CPU seconds (user + system, all threads), RSS and
    the monotonic time it was taken."""

    cpu_s: float
    rss_bytes: int
    at_s: float

    def cores_since(self, earlier: Usage) -> float:
        """Average CPU used between two samples, in cores (1.0 = one core busy)."""
        elapsed = self.at_s - earlier.at_s
        return (self.cpu_s - earlier.cpu_s) / elapsed if elapsed > 0 else float("nan")


def python_command() -> list[str]:
    """`python -m broker` with this interpreter."""
    return [sys.executable, "-m", "broker"]


def cli_command() -> list[str]:
    """The `rocketq broker start` console script installed next to this interpreter."""
    return [str(Path(sys.executable).parent / "rocketq"), "broker", "start"]


class BrokerProcess:
    def __init__(self, store_dir: Path, *, settings: Mapping[str, str] | None = None,
                 command: Sequence[str] | None = None, cpus: frozenset[int] | None = None,
                 keep_lines: int = 200) -> None:
        self._store_dir = store_dir
        self._settings = dict(settings or {})
        self._command = list(command) if command is not None else python_command()
        self._cpus = cpus
        self._process: asyncio.subprocess.Process | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self._ps: psutil.Process | None = None
        self._profiler: asyncio.subprocess.Process | None = None
        self.address = ""
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("broker process is not started")
        return self._process.pid

    @property
    def log_tail(self) -> list[str]:
        return list(self._lines)

    async def start(self) -> None:
        """Spawn the broker and return once it logged its address; raises RuntimeError (with the
        log tail) when it exits or stays silent for `START_TIMEOUT_S`."""
        args = [*self._command, "--listen-port", "0", "--store-dir", str(self._store_dir)]
        for key, value in self._settings.items():
            args += ["--set", f"{key}={value}"]
        self._process = await asyncio.create_subprocess_exec(
            *args, cwd=REPO_ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, preexec_fn=self._pin if self._cpus else None)
        assert self._process.stderr is not None
        stderr = self._process.stderr
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while True:
                    line = await stderr.readline()
                    if not line:
                        raise RuntimeError(f"broker exited before listening: {self._tail()}")
                    self._lines.append(line.decode(errors="replace").rstrip())
                    match = _LISTENING.search(line)
                    if match:
                        self.address = f"{match[1].decode()}:{int(match[2])}"
                        break
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"broker did not log 'listening on' within {START_TIMEOUT_S} s: "
                               f"{self._tail()}") from None
        except BaseException:
            await self.stop()
            raise
        self._drain_task = asyncio.create_task(self._drain(stderr))
        self._ps = psutil.Process(self._process.pid)
        await self._start_profiler(self._process.pid)

    async def _start_profiler(self, pid: int) -> None:
        directory = os.environ.get("RQ_BENCH_PYSPY")
        if not directory:
            return
        Path(directory).mkdir(parents=True, exist_ok=True)
        output = Path(directory) / f"broker-{pid}.txt"
        self._profiler = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", "200",
            "--nonblocking", "--format", "raw", "--output", str(output),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        log.warning("profiling broker pid %d with py-spy into %s", pid, output)

    async def _stop_profiler(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is None or profiler.returncode is not None:
            return
        profiler.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(10):
                await profiler.wait()
        except TimeoutError:
            profiler.kill()
            await profiler.wait()

    def _pin(self) -> None:
        """In the child before exec: every thread the broker starts inherits this CPU set."""
        assert self._cpus is not None
        os.sched_setaffinity(0, self._cpus)

    async def _drain(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self._lines.append(text)
            if " ERROR " in text or "Traceback" in text:
                log.warning("broker: %s", text)

    def _tail(self, count: int = 15) -> str:
        return " | ".join(list(self._lines)[-count:]) or "(no output)"

    def usage(self) -> Usage:
        """CPU seconds and RSS now; raises RuntimeError if the broker is not running."""
        if self._ps is None:
            raise RuntimeError("broker process is not started")
        with self._ps.oneshot():
            times = self._ps.cpu_times()
            rss = self._ps.memory_info().rss
        return Usage(times.user + times.system, rss, time.monotonic())

    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def stop(self) -> int | None:
        """SIGTERM and wait (bounded), SIGKILL if it hangs; returns the exit code."""
        process = self._process
        if process is None:
            return None
        await self._stop_profiler()
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await process.wait()
            except TimeoutError:
                log.warning("broker pid %d ignored SIGTERM for %.0f s; killing it", process.pid,
                            STOP_TIMEOUT_S)
                process.kill()
                await process.wait()
        if self._drain_task is not None:
            try:
                async with asyncio.timeout(5):
                    await self._drain_task
            except TimeoutError:
                self._drain_task.cancel()
            self._drain_task = None
        self.exit_code = process.returncode
        if self.exit_code not in (0, None):
            log.warning("broker exited with %s: %s", self.exit_code, self._tail())
        return self.exit_code

    async def __aenter__(self) -> BrokerProcess:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (for the broker's metrics endpoint)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
