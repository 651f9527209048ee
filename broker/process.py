"""`BrokerSubprocess`: a broker started from the command line in a child process, for tools and
tests that need a real separate broker (the benchmarks, the flights demo, the kill -9 test).

It starts `rocketq broker start --listen-port 0 --store-dir DIR [--set k=v ...]` (with
`metrics_port=0` and `grpc_port=0` unless `settings` name them, so several brokers never fight
over 5557 or 8081), learns the address
from the `listening on HOST:PORT` line on stderr, keeps draining stderr for the whole run (the last
lines are kept for error messages, ERROR lines are logged), and stops with SIGTERM, a bounded wait,
then SIGKILL.

    async with BrokerSubprocess(store_dir, settings={"store.flush_disk_type": "ASYNC_FLUSH"}) as broker:
        ... broker.address ...
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from protocol.lifecycle import Lifecycle

log = logging.getLogger(__name__)
_LISTENING = re.compile(rb"listening on (\S+):(\d+)")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


async def signal_and_wait(process: asyncio.subprocess.Process, sig: int, timeout_s: float) -> bool:
    """Send `sig` to `process` and wait for it to exit, at most `timeout_s`; past that, SIGKILL it
    and wait. False when it had to be killed."""
    process.send_signal(sig)
    try:
        async with asyncio.timeout(timeout_s):
            await process.wait()
        return True
    except TimeoutError:
        process.kill()
        await process.wait()
        return False


def cli_command() -> list[str]:
    """`rocketq broker start`: the console script next to this interpreter, else `python -m broker`."""
    script = Path(sys.executable).parent / "rocketq"
    if script.exists():
        return [str(script), "broker", "start"]
    return [sys.executable, "-m", "broker"]


class BrokerSubprocess(Lifecycle):
    def __init__(self, store_dir: Path | None, *, settings: Mapping[str, str] | None = None,
                 command: Sequence[str] | None = None, cwd: Path | None = None,
                 preexec_fn: Callable[[], None] | None = None, keep_lines: int = 200, listen_port: int = 0) -> None:
        self.store_dir = store_dir
        self.listen_port = listen_port       # 0: any free port; a fixed one lets a restart keep the address
        self._settings = dict(settings or {})
        self._command = list(command) if command is not None else cli_command()
        self._cwd, self._preexec_fn = cwd, preexec_fn
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

    @property
    def log_lines(self) -> list[str]:
        return list(self._lines)

    def tail(self, count: int = 15) -> str:
        """The last `count` lines the broker logged, joined by " | "."""
        return " | ".join(list(self._lines)[-count:]) or "(no output)"

    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        """Spawn the broker and return once it logged its address; raises `RuntimeError` (with the
        log tail) when it exits first or stays silent for `START_TIMEOUT_S`."""
        args = [*self._command, "--listen-port", str(self.listen_port)]
        if self.store_dir is not None:        # None: a name server (`python -m namesrv`), which has no store
            args += ["--store-dir", str(self.store_dir)]
        defaults = {"metrics_port": "0"} if self.store_dir is None else {"metrics_port": "0", "grpc_port": "0"}
        for key, value in {**defaults, **self._settings}.items():
            args += ["--set", f"{key}={value}"]
        self._process = await asyncio.create_subprocess_exec(
            *args, cwd=self._cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, preexec_fn=self._preexec_fn)
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

    def signal(self, sig: int) -> None:
        """Send `sig` (SIGSTOP / SIGCONT for a paused broker in tests) if it is running."""
        if self._process is not None and self._process.returncode is None:
            self._process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL now (a crash, for tests); `stop()` then only collects the exit code."""
        if self._process is not None and self._process.returncode is None:
            self._process.kill()

    async def stop(self) -> int | None:
        """SIGTERM and wait (bounded by `STOP_TIMEOUT_S`), SIGKILL if it hangs; returns the exit code."""
        process = self._process
        if process is None:
            return None
        if process.returncode is None and not await signal_and_wait(process, signal.SIGTERM, STOP_TIMEOUT_S):
            log.warning("broker pid %d ignored SIGTERM for %.0f s; killed it", process.pid, STOP_TIMEOUT_S)
        drain, self._drain_task = self._drain_task, None
        if drain is not None:
            try:
                async with asyncio.timeout(5):
                    await drain
            except TimeoutError:
                drain.cancel()
                await asyncio.gather(drain, return_exceptions=True)
        self.exit_code = process.returncode
        if self.exit_code not in (0, -signal.SIGKILL):
            log.warning("broker pid %d exited with %s: %s", process.pid, self.exit_code, self.tail())
        return self.exit_code

    _close = stop
