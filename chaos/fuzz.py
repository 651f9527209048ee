"""`python -m chaos.fuzz [--frames 1000000] [--connections 8] [--seed N]` (`make fuzz`): random and
mutated frames at a broker in its own process, then checks that it still serves, that its RSS came
back near its start, and that its store passes the offline consistency check (`rocketq store check`).

Frames: every request code the broker serves plus random codes; headers whose `ext` fields have
random names and wrong types (str for int, nil, lists, maps, huge ints, floats, bools), integers at
and beyond the int32 and int64 bounds (negatives, 2**63, 2**64 - 1) in fields that are otherwise
plausible, properties near and over their 32,767-byte limit (in sends and batch items), random
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
INT_FIELDS = ["queue_id", "queue_offset", "max_msg_nums", "sys_flag", "commit_offset", "suspend_timeout_ms",
              "sub_version", "born_timestamp", "flag", "reconsume_times", "max_reconsume_times", "offset",
              "commit_log_offset", "delay_level", "read_queue_nums", "write_queue_nums", "perm", "timestamp",
              "max_num", "begin_timestamp", "end_timestamp", "retry_queue_nums", "retry_max_times", "broker_id"]
FIELD_NAMES = [*INT_FIELDS, "topic", "consumer_group", "producer_group", "subscription", "expression_type",
               "properties", "msg_id", "client_id", "group", "key", "group_name"]
# Integers at and past the bounds header fields are checked against (queue ids 0..1023, int32,
# int64, msgpack's uint64).
EDGE_INTS = [-1, 0, 1023, 1024, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**63 - 1, 2**63,
             -(2**63), 2**64 - 1]
MAX_PROPERTIES_BYTES = 32_767
CHUNK_FRAMES = 200


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 0:
        return rng.choice(EDGE_INTS) if rng.random() < 0.5 else rng.randrange(-(1 << 63), 1 << 64)
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


def sized_properties(rng: random.Random, size: int) -> dict[str, str]:
    """Properties whose RocketMQ string (key, value, 2 separators an entry) is `size` bytes: one big
    value, or many short entries, sometimes with multi-byte characters."""
    if rng.random() < 0.5:
        return {"TAGS": "a", "big": "x" * max(0, size - 12)}
    entries, pad = divmod(size, 12)
    properties = {f"k{i:07d}": "é" if rng.random() < 0.1 else "vv" for i in range(entries)}
    properties["pad"] = "p" * max(0, pad - 5)
    return properties


def large_properties(rng: random.Random) -> dict[str, str]:
    """Properties near and over the limit (and now and then far over it)."""
    if rng.random() < 0.05:
        return sized_properties(rng, rng.randrange(64 * 1024, 512 * 1024))
    return sized_properties(rng, MAX_PROPERTIES_BYTES + rng.randrange(-8, 9))


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
        if rng.random() < 0.3:      # one integer at or past its bounds, the rest plausible
            ext[rng.choice(INT_FIELDS)] = rng.choice(EDGE_INTS)
        if rng.random() < 0.01:
            ext["properties"] = large_properties(rng)
    header = {"code": rng.choice(CODES) if rng.random() < 0.9 else rng.randrange(-5, 1000),
              "opaque": rng.randrange(0, 1 << 32), "flag": rng.choice([0, 0, 0, 2, 1]), "version": 1,
              "remark": None, "ext": ext}
    packed: bytes = msgpack.packb(header, use_bin_type=True)
    if header["code"] == RequestCode.SEND_BATCH_MESSAGE and rng.random() < 0.3:
        body = batch_body(rng)
    else:
        body = rng.randbytes(rng.randrange(0, 256)) if rng.random() < 0.5 else b""
    return struct.pack(">II", 4 + len(packed) + len(body), len(packed)) + packed + body


def batch_body(rng: random.Random) -> bytes:
    """A SEND_BATCH_MESSAGE body of 1..4 items, some with flags at the int32 bounds or properties
    near and over their limit."""
    items = []
    for _ in range(rng.randrange(1, 5)):
        properties = large_properties(rng) if rng.random() < 0.1 else {"TAGS": "b"}
        flag = rng.choice(EDGE_INTS) if rng.random() < 0.2 else 0
        items.append([properties, flag, rng.randbytes(rng.randrange(0, 64))])
    packed: bytes = msgpack.packb(items, use_bin_type=True)
    return packed


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
