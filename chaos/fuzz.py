"""`python -m chaos.fuzz [--frames 1000000] [--connections 8] [--seed N]` (`make fuzz`): random and
mutated frames at a broker in its own process, then checks that it still serves, that its RSS came
back near its start, and that its store passes the offline consistency check (`rocketq store check`).

Frames: every request code the broker serves plus random codes; headers whose `ext` fields have
random names and wrong types (str for int, nil, lists, maps, huge ints, floats, bools), random
bodies, random flags (one-way included). One chunk in 20 ends with a mutated frame (flipped
bytes, header keys of the wrong type, a truncated header, a frame_length below 4 or above
`max_frame_bytes`), which makes the broker close that connection; the fuzzer reconnects.
Responses are read and discarded. Exits 1 if a check fails."""

from __future__ import annotations

import argparse
import asyncio
import random
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import psutil

from broker.process import BrokerSubprocess
from broker.store.check import check_store
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.codes import RequestCode
from protocol.headers import SendMessageRequestHeader

MIB = 1024 * 1024
CODES = [int(code) for code in RequestCode]
FIELD_NAMES = ["topic", "queue_id", "queue_offset", "consumer_group", "producer_group", "max_msg_nums",
               "sys_flag", "commit_offset", "suspend_timeout_ms", "sub_version", "subscription",
               "expression_type", "properties", "born_timestamp", "flag", "msg_id", "offset", "client_id",
               "commit_log_offset", "group", "delay_level", "read_queue_nums", "perm", "timestamp"]
CHUNK_FRAMES = 200


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 0:
        return rng.randrange(-(1 << 63), 1 << 63)
    if kind == 1:
        return rng.randrange(0, 64)
    if kind == 2:
        return "".join(rng.choice("abT_%|-0 ./\x00é") for _ in range(rng.randrange(0, 20)))
    if kind == 3:
        return None
    if kind == 4:
        return rng.random() * 1e6
    if kind == 5:
        return rng.random() < 0.5
    if kind == 6:
        return rng.randbytes(rng.randrange(0, 16))
    if kind == 7:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(FIELD_NAMES): random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


def random_frame(rng: random.Random) -> bytes:
    """A well-framed request with a random code, random typed `ext` and a random body."""
    ext = {rng.choice(FIELD_NAMES): random_value(rng) for _ in range(rng.randrange(0, 8))}
    if rng.random() < 0.3:          # plausible values, so deeper paths run
        ext.update(topic=rng.choice(["fz", "fz2", "%RETRY%g"]), queue_id=rng.randrange(-1, 6),
                   consumer_group="g", producer_group="pg", queue_offset=rng.randrange(-2, 50),
                   max_msg_nums=rng.randrange(-1, 40), suspend_timeout_ms=rng.choice([0, 0, 50]),
                   sys_flag=rng.randrange(0, 32), sub_version=0, born_timestamp=1, flag=0, properties={},
                   group="g", commit_log_offset=rng.choice([0, 0, rng.randrange(-1, 4096)]),
                   delay_level=rng.randrange(-1, 20))
    header = {"code": rng.choice(CODES) if rng.random() < 0.9 else rng.randrange(-5, 1000),
              "opaque": rng.randrange(0, 1 << 32), "flag": rng.choice([0, 0, 0, 2, 1]), "version": 1,
              "remark": None, "ext": ext}
    packed: bytes = msgpack.packb(header, use_bin_type=True)
    body = rng.randbytes(rng.randrange(0, 256)) if rng.random() < 0.5 else b""
    return struct.pack(">II", 4 + len(packed) + len(body), len(packed)) + packed + body


def mutated_frame(rng: random.Random) -> bytes:
    """A frame that is (most likely) a protocol error: the broker answers or not, then closes."""
    frame = bytearray(random_frame(rng))
    kind = rng.randrange(5)
    if kind == 4:                    # header keys of the wrong type
        header: dict[str, Any] = {"code": 10, "opaque": 1, "flag": 0, "version": 1, "remark": None, "ext": {}}
        header[rng.choice(["code", "opaque", "flag", "version", "remark", "ext"])] = random_value(rng)
        packed: bytes = msgpack.packb(header, use_bin_type=True)
        return struct.pack(">II", 4 + len(packed), len(packed)) + packed
    if kind == 0:
        for _ in range(rng.randrange(1, 6)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
    elif kind == 1:
        frame[0:4] = struct.pack(">I", rng.randrange(0, 4))
    elif kind == 2:
        frame[0:4] = struct.pack(">I", (1 << 31) + rng.randrange(1 << 20))
    else:
        frame[4:8] = struct.pack(">I", rng.randrange(1 << 32))
    return bytes(frame)


async def fuzz_connection(host: str, port: int, rng: random.Random, frames: int, sent: list[int]) -> int:
    """Send `frames` frames over as many connections as the broker's closing makes necessary;
    returns how many connections were opened."""
    opened = 0
    remaining = frames
    while remaining > 0:
        reader, writer = await asyncio.open_connection(host, port)
        opened += 1
        drain = asyncio.create_task(_discard(reader))
        try:
            while remaining > 0:
                count = min(CHUNK_FRAMES, remaining)
                chunk = [random_frame(rng) for _ in range(count)]
                if rng.random() < 0.05:
                    chunk[-1] = mutated_frame(rng)
                writer.write(b"".join(chunk))
                await writer.drain()
                remaining -= count
                sent[0] += count
                if drain.done():
                    break
        except (ConnectionError, OSError):
            pass
        writer.close()
        drain.cancel()
        await asyncio.gather(drain, return_exceptions=True)
    return opened


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(1 << 16):
        pass


async def still_serves(address: str) -> bool:
    remoting = RemotingClient()
    try:
        api = ClientAPI(remoting)
        header = SendMessageRequestHeader(producer_group="pg", topic="fuzz_ok", queue_id=0, flag=0,
                                          born_timestamp=0, properties={})
        result = await api.send_message(address, header, b"still here")
        return result.queue_offset >= 0
    finally:
        await remoting.close()


async def run(frames: int, connections: int, seed: int, workdir: Path, *, rss_check: bool = True) -> bool:
    """Fuzz a broker of its own; True when it still serves, its store checks clean, its RSS came
    back within 64 MB of its start (unless `rss_check` is off: a broker built with AddressSanitizer
    keeps freed memory in quarantine) and every frame was sent. When it no longer serves, its last
    log lines are printed (a crash's traceback, or a sanitizer's report)."""
    store_dir = workdir / "store"
    broker = BrokerSubprocess(store_dir)
    await broker.start()
    ps = psutil.Process(broker.pid)
    try:
        await still_serves(broker.address)
        rss_before = ps.memory_info().rss
        host, port = broker.address.rsplit(":", 1)
        sent = [0]
        peak = rss_before
        started = time.monotonic()
        tasks = [asyncio.create_task(fuzz_connection(host, int(port), random.Random(seed * 1000 + i),
                                                     frames // connections, sent)) for i in range(connections)]
        while not all(t.done() for t in tasks):
            peak = max(peak, ps.memory_info().rss)
            await asyncio.sleep(0.2)
        opened = sum(await asyncio.gather(*tasks))
        elapsed = time.monotonic() - started
        await asyncio.sleep(2)                      # let the broker finish what it read
        serves = await still_serves(broker.address)
        rss_after = ps.memory_info().rss
    finally:
        await broker.stop()
    report = check_store(store_dir)
    print(f"fuzz seed {seed}: {sent[0]} frames over {opened} connections ({connections} at a time) in "
          f"{elapsed:.0f} s ({sent[0] / elapsed:,.0f} frames/s)")
    print(f"  broker RSS before {rss_before / MIB:.1f} MB, peak {peak / MIB:.1f} MB, after {rss_after / MIB:.1f} MB")
    print(f"  still serves: {serves}; store check: {report.queues} queues, {report.units} units, "
          f"{report.problem_count} problems")
    near_start = rss_after <= rss_before + 64 * MIB or not rss_check
    print(f"  RSS back near start (within 64 MB): {near_start}" + ("" if rss_check else " (not checked)"))
    for problem in report.problems[:10]:
        print(f"  problem: {problem}")
    if not serves:
        print("  the broker's last log lines:", *broker.log_lines[-40:], sep="\n    ")
    return serves and report.ok and near_start and sent[0] >= frames


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.fuzz", description=__doc__)
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--rss-check", action=argparse.BooleanOptionalAction, default=True,
                        help="fail when the broker's RSS did not come back within 64 MB of its start "
                             "(default on; off under a sanitizer, see chaos.sanitize)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rocketq-fuzz-") as scratch:
        ok = asyncio.run(run(args.frames, args.connections, args.seed, Path(scratch), rss_check=args.rss_check))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
