"""The servers of one comparison: a `redis-server` subprocess (`RedisServer`), a rocketq broker
subprocess (`bench.broker_proc.BrokerProcess`), the two `Pairing`s that match their durability,
and `ServerMeter`, CPU and RSS of either one (and of this process) over an interval.

    async with RedisServer(durable=True) as redis_server, running_broker(opts, pairing.broker_settings) as broker:
        ... redis_server.port ... broker.address ... ServerMeter(redis_server).start() ...

Redis runs in the foreground on a free loopback port, `--save ""`, either `--appendonly no`
(in-memory) or `--appendonly yes --appendfsync always` (every write fsynced before its reply, in a
temporary `--dir`), with `--maxclients 20000`; it inherits this process's RLIMIT_NOFILE, raised by
`raise_fd_limit()` first. Stop is SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL, each bounded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil
import redis.asyncio as aioredis

from bench.broker_proc import Usage, free_port, process_usage
from bench.common import store_root
from protocol.lifecycle import Lifecycle

log = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
MAX_CLIENTS = 20_000
WANTED_FDS = 32_768


@dataclass(frozen=True, slots=True)
class Pairing:
    """Which rocketq flush mode is compared with which Redis persistence."""

    name: str                 # "in-memory" or "durable"
    flush_disk_type: str      # rocketq store.flush_disk_type
    redis_durable: bool       # appendonly yes + appendfsync always

    @property
    def broker_settings(self) -> dict[str, str]:
        return {"store.flush_disk_type": self.flush_disk_type}

    @property
    def label(self) -> str:
        redis = "appendfsync always" if self.redis_durable else "no persistence"
        return f"{self.name}: rocketq {self.flush_disk_type} vs Redis {redis}"


IN_MEMORY = Pairing("in-memory", "ASYNC_FLUSH", redis_durable=False)
DURABLE = Pairing("durable", "SYNC_FLUSH", redis_durable=True)


def raise_fd_limit(wanted: int = WANTED_FDS) -> int:
    """Raise this process's RLIMIT_NOFILE (soft, and hard when allowed: root) towards `wanted`;
    children started afterwards inherit it. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, wanted))
            hard = wanted
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def redis_server_binary() -> str:
    """The path of `redis-server`; raises RuntimeError naming the install command when missing."""
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError("redis-server is not on PATH: `make bench-peers` installs it "
                           "(apt-get install -y redis-server)")
    return path


def redis_version() -> str:
    import subprocess

    out = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


class RedisServer(Lifecycle):
    """`redis-server` in a subprocess on 127.0.0.1:`port`, with its log in a temporary directory."""

    def __init__(self, *, durable: bool) -> None:
        self.durable = durable
        self.port = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._ps: psutil.Process | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("redis-server is not started")
        return self._process.pid

    @property
    def log_path(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "redis.log"

    def log_tail(self, count: int = 10) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-count:])
        except OSError:
            return "(no log)"

    def client(self, *, max_connections: int = 64) -> aioredis.Redis:
        """A redis.asyncio client (hiredis parser when installed) with its own connection pool."""
        return aioredis.Redis(host="127.0.0.1", port=self.port, max_connections=max_connections)

    async def start(self) -> None:
        """Spawn and return once PING answers; raises RuntimeError (with the log tail) otherwise."""
        self._dir = tempfile.TemporaryDirectory(prefix="rocketq-peers-redis-", dir=store_root())
        self.port = free_port()
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.durable
                       else ["--appendonly", "no"])
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                *persistence, "--dir", self._dir.name, "--daemonize", "no", "--maxclients", str(MAX_CLIENTS),
                "--logfile", str(self.log_path), "--tcp-backlog", "4096"]
        self._process = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        self._ps = psutil.Process(self._process.pid)
        deadline = time.monotonic() + START_TIMEOUT_S
        probe = aioredis.Redis(host="127.0.0.1", port=self.port, single_connection_client=True)
        try:
            while True:
                if self._process.returncode is not None:
                    raise RuntimeError(f"redis-server exited at start: {self.log_tail()}")
                try:
                    if await probe.ping():
                        return
                except (ConnectionError, OSError, aioredis.ConnectionError):
                    pass
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"redis-server did not answer PING in {START_TIMEOUT_S:.0f} s: "
                                       f"{self.log_tail()}")
                await asyncio.sleep(0.05)
        except BaseException:
            await self.stop()
            raise
        finally:
            await probe.aclose()

    def usage(self) -> Usage:
        """CPU seconds (all threads: the AOF fsync thread included) and RSS now."""
        if self._ps is None:
            raise RuntimeError("redis-server is not started")
        return process_usage(self._ps)

    async def stop(self) -> int | None:
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    admin = aioredis.Redis(host="127.0.0.1", port=self.port, single_connection_client=True)
                    with contextlib.suppress(aioredis.ConnectionError, ConnectionError, OSError):
                        await admin.shutdown(nosave=True)
                    with contextlib.suppress(Exception):
                        await admin.aclose()
            await _wait_or_kill(process)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        return process.returncode if process is not None else None

    _close = stop


async def _wait_or_kill(process: asyncio.subprocess.Process) -> None:
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if process.returncode is not None:
            return
        if sig is not None:
            process.send_signal(sig)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await process.wait()
            return
        except TimeoutError:
            log.warning("redis-server pid %d still running; sending %s", process.pid, sig or signal.SIGTERM)


class Measured(Protocol):
    def usage(self) -> Usage: ...


class ServerMeter:
    """Server (redis-server or the broker) and client (this process) CPU in cores over an interval,
    and the server's RSS at the end."""

    def __init__(self, server: Measured) -> None:
        self._server = server
        self._me = psutil.Process()
        self._start: Usage | None = None
        self._client_start = (0.0, 0.0)

    def _client_cpu_s(self) -> tuple[float, float]:
        """(user + system, system) CPU seconds of this process."""
        times = self._me.cpu_times()
        return float(times.user + times.system), float(times.system)

    def start(self) -> ServerMeter:
        self._start = self._server.usage()
        self._client_start = self._client_cpu_s()
        return self

    def stop(self) -> dict[str, float]:
        """{"server_cores", "client_cores", "server_rss_mb"} since `start`, and the kernel's part
        of each CPU figure ("server_system_cores", "client_system_cores")."""
        assert self._start is not None
        now = self._server.usage()
        elapsed = now.at_s - self._start.at_s
        client_cpu, client_system = self._client_cpu_s()
        if elapsed <= 0:
            return {"server_cores": float("nan"), "client_cores": float("nan"), "server_system_cores": float("nan"),
                    "client_system_cores": float("nan"), "server_rss_mb": round(now.rss_bytes / (1 << 20), 1)}
        return {"server_cores": round(now.cores_since(self._start), 3),
                "client_cores": round((client_cpu - self._client_start[0]) / elapsed, 3),
                "server_system_cores": round((now.system_s - self._start.system_s) / elapsed, 3),
                "client_system_cores": round((client_system - self._client_start[1]) / elapsed, 3),
                "server_rss_mb": round(now.rss_bytes / (1 << 20), 1)}


def cpu_us_per_call(cpu: dict[str, float], calls_s: float) -> dict[str, float]:
    """`ServerMeter.stop()`'s cores turned into CPU µs per call at `calls_s` calls per second:
    {"server_cpu_us_per_call", "server_system_us_per_call", "client_cpu_us_per_call",
    "client_system_us_per_call"} (NaN when no call finished)."""
    out: dict[str, float] = {}
    for who in ("server", "client"):      # cores / (calls per second)
        for part, key in (("cpu", f"{who}_cores"), ("system", f"{who}_system_cores")):
            out[f"{who}_{part}_us_per_call"] = round(cpu[key] / calls_s * 1e6, 1) if calls_s else float("nan")
    return out
