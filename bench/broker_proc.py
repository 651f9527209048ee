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
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from broker.process import BrokerSubprocess, cli_command, signal_and_wait

__all__ = ["BrokerProcess", "Usage", "cli_command", "free_port", "python_command"]

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
    system_s: float = 0.0      # the kernel's part of cpu_s (syscalls, wake-ups)
    read_calls: int = 0        # read-type system calls so far (/proc/<pid>/io syscr: socket reads too)
    write_calls: int = 0       # write-type system calls so far (syscw)

    def cores_since(self, earlier: Usage) -> float:
        """Average CPU used between two samples, in cores (1.0 = one core busy)."""
        elapsed = self.at_s - earlier.at_s
        return (self.cpu_s - earlier.cpu_s) / elapsed if elapsed > 0 else float("nan")


def process_usage(process: psutil.Process) -> Usage:
    """`process`'s `Usage` now (its system-call counts left 0 where /proc/<pid>/io is not readable)."""
    with process.oneshot():
        times = process.cpu_times()
        rss = process.memory_info().rss
        try:
            io = process.io_counters()
        except (psutil.AccessDenied, AttributeError):
            read_calls = write_calls = 0
        else:
            read_calls, write_calls = io.read_count, io.write_count
    return Usage(times.user + times.system, rss, time.monotonic(), times.system, read_calls, write_calls)


def python_command() -> list[str]:
    """`python -m broker` with this interpreter."""
    return [sys.executable, "-m", "broker"]


class BrokerProcess(BrokerSubprocess):
    """A `BrokerSubprocess` (the repo root as working directory, `python -m broker` unless told
    otherwise) with CPU/RSS sampling, optional CPU pinning and the optional py-spy recorder."""

    def __init__(self, store_dir: Path | None, *, settings: Mapping[str, str] | None = None,
                 command: Sequence[str] | None = None, cpus: frozenset[int] | None = None,
                 keep_lines: int = 200) -> None:
        super().__init__(store_dir, settings=settings,
                         command=command if command is not None else python_command(), cwd=REPO_ROOT,
                         preexec_fn=self._pin if cpus else None, keep_lines=keep_lines)
        self._cpus = cpus
        self._ps: psutil.Process | None = None
        self._profiler: asyncio.subprocess.Process | None = None

    @property
    def log_tail(self) -> list[str]:
        return self.log_lines

    async def start(self) -> None:
        await super().start()
        self._ps = psutil.Process(self.pid)
        await self._start_profiler(self.pid)

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
        if profiler is not None and profiler.returncode is None:
            await stop_profiler(profiler)

    def _pin(self) -> None:
        """In the child before exec: every thread the broker starts inherits this CPU set."""
        assert self._cpus is not None
        os.sched_setaffinity(0, self._cpus)

    def usage(self) -> Usage:
        """CPU seconds and RSS now; raises RuntimeError if the broker is not running."""
        if self._ps is None:
            raise RuntimeError("broker process is not started")
        return process_usage(self._ps)

    async def stop(self) -> int | None:
        await self._stop_profiler()
        return await super().stop()

    async def __aenter__(self) -> BrokerProcess:
        await self.start()
        return self


async def stop_profiler(profiler: asyncio.subprocess.Process) -> None:
    """SIGINT a `py-spy record` so it writes its output; kill it if it takes over 10 s."""
    await signal_and_wait(profiler, signal.SIGINT, 10)


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (for the broker's metrics endpoint)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
