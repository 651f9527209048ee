"""Fault kind "disk filled by another process on a tmpfs or loop image": while a probe producer sends,
another process fills the file system holding the broker's store; the broker must go on answering
(SERVICE_NOT_AVAILABLE once full, never a crash), keep every acknowledged message, take sends again
once the space is freed, and come up again on a file system that is still full.

Call it with a running broker subprocess whose store lies on a small file system of its own (a
tmpfs or a loop image the caller mounted; `filler_dir` is a directory on that file system):

    async with BrokerSubprocess(mount / "store", settings=SMALL_STORE_SETTINGS) as broker:
        result = await disk_fill(broker, duration_s=3, filler_dir=mount)
    assert result.crashed == 0 and result.lost_after_free == 0 and result.lost_after_restart == 0

Steps: the probe sends (one at a time, `topics` topics of 4 queues, and now and then a new topic,
so consume-queue files and topic configs are created on the full disk too) while a filler process
writes zeros until ENOSPC; after `duration_s` the filler's file is deleted and the probe runs until
a send is acknowledged again (bounded by `resume_timeout_s`); every acknowledged message is pulled
back; then the broker is stopped, the disk filled again, the broker started on it (it must come
up, refusing sends), the filler deleted, sends resumed, and every acknowledged message pulled back
once more. SMALL_STORE_SETTINGS keeps files small enough for a 16-64 MiB file system."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from broker.process import BrokerSubprocess
from chaos.topic_create_kill import Acked, count_lost, send_to
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.errors import ConnectionClosed, MQError, RequestTimeout, ServiceNotAvailable

SMALL_STORE_SETTINGS = {"store.commit_log_segment_bytes": str(1 << 20), "store.consume_queue_segment_units": "20000",
                        "store.disk_check_interval_ms": "100", "store.disk_space_warning_level_ratio": "100",
                        "store.disk_max_used_space_ratio": "100"}
_FILL = """
import sys
with open(sys.argv[1], "ab") as out:
    for chunk in (1 << 20, 1 << 12):
        try:
            while True:
                out.write(bytes(chunk))
                out.flush()
        except OSError:
            pass
"""


@dataclass(frozen=True, slots=True)
class DiskFillResult:
    acknowledged: int               # sends answered SUCCESS
    refused: int                    # sends answered SERVICE_NOT_AVAILABLE (14)
    other_errors: int               # other error answers (a timeout, a lost connection)
    crashed: int                    # times the broker process was found dead
    refusal_remark: str             # the first SERVICE_NOT_AVAILABLE remark
    resumed_after_free_ms: float    # from deleting the filler to the next acknowledged send (inf: never)
    lost_after_free: int            # acknowledged messages not pullable once space was freed
    restarted_when_full: bool       # the broker came up on the full file system
    lost_after_restart: int         # acknowledged messages not pullable after that restart


@dataclass
class _Probe:
    acked: Acked
    refused: int = 0
    other_errors: int = 0
    remark: str = ""
    sent: int = 0

    async def send_one(self, api: ClientAPI, address: str, topics: int) -> bool:
        """One send of the probe; True when it was acknowledged."""
        index = self.sent
        self.sent += 1
        topic = f"fill{index % topics}" if index % 50 else f"fill_new{index}"
        try:
            await send_to(api, address, topic, index % 4 if index % 50 else 0, b"%d" % index, self.acked)
        except ServiceNotAvailable as exc:
            self.refused += 1
            self.remark = self.remark or exc.remark
            return False
        except (MQError, ConnectionClosed, RequestTimeout):
            self.other_errors += 1
            return False
        return True


async def fill(filler: Path) -> None:
    """Write zeros to `filler` in another process until its file system is full (ENOSPC)."""
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", _FILL, str(filler),
                                                   stderr=asyncio.subprocess.DEVNULL)   # ENOSPC at close
    await process.wait()


async def disk_fill(broker: BrokerSubprocess, duration_s: float, *, filler_dir: Path, topics: int = 2,
                    resume_timeout_s: float = 10.0, acknowledged_before_fill: int = 0) -> DiskFillResult:
    """Run the steps of the module docstring on `broker` (started; left running at the end); the
    filler starts once the probe has `acknowledged_before_fill` sends acknowledged (a loaded
    machine's probe is slow; for at most `resume_timeout_s`)."""
    probe = _Probe(acked={})
    filler = filler_dir / "disk_fill.filler"
    crashed = 0
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    try:
        started = time.monotonic()
        while len(probe.acked) < acknowledged_before_fill and time.monotonic() - started < resume_timeout_s:
            await probe.send_one(api, broker.address, topics)
        filling = asyncio.create_task(fill(filler))
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline or not filling.done():
            await probe.send_one(api, broker.address, topics)
            if not broker.alive():
                crashed += 1
                await filling
                break
        filler.unlink()
        if not broker.alive():
            await broker.stop()
            await broker.start()
        resumed = await _resume(probe, api, broker, topics, resume_timeout_s)
        resumed_ms = math.inf if resumed is None else resumed
        lost_after_free = await count_lost(api, broker.address, probe.acked)
        await broker.stop()
        await fill(filler)
        restarted = True
        try:
            await broker.start()
        except RuntimeError:
            restarted = False
            crashed += 1
        filler.unlink()
        if not restarted:
            await broker.start()
        await _resume(probe, api, broker, topics, resume_timeout_s)
        lost_after_restart = await count_lost(api, broker.address, probe.acked)
    finally:
        await remoting.close()
        filler.unlink(missing_ok=True)
    return DiskFillResult(
        acknowledged=len(probe.acked), refused=probe.refused, other_errors=probe.other_errors, crashed=crashed,
        refusal_remark=probe.remark, resumed_after_free_ms=resumed_ms, lost_after_free=lost_after_free,
        restarted_when_full=restarted, lost_after_restart=lost_after_restart)


async def _resume(probe: _Probe, api: ClientAPI, broker: BrokerSubprocess, topics: int,
                  timeout_s: float) -> float | None:
    """Send until one is acknowledged; how long it took in ms (None: not within `timeout_s`)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if await probe.send_one(api, broker.address, topics):
            return (time.monotonic() - started) * 1000
        await asyncio.sleep(0.01)          # pacing while refused, not a synchronisation
    return None
