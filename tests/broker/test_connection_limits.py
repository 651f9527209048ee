"""Connection limits (issue 12): max_connections, frame_read_timeout_ms, channel_expired_timeout_ms,
max_buffered_bytes. The stalled-frame case runs the broker in its own process to measure its RSS."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from pathlib import Path

import msgpack
import pytest

from broker.broker import Broker
from broker.process import BrokerSubprocess
from broker.remoting.ratelimit import RateLimitedLog
from client.api import ClientAPI
from protocol.clock import ManualClock
from protocol.errors import ConnectionClosed
from tests.conftest import broker_config
from tests.helpers import send, wait_until

MIB = 1024 * 1024


def partial_frame_header(frame_bytes: int) -> bytes:
    """The first bytes of a frame announcing `frame_bytes` (a complete header, body to follow)."""
    header: bytes = msgpack.packb({"code": 10, "opaque": 1, "flag": 0, "version": 1, "remark": None, "ext": {}})
    return struct.pack(">II", frame_bytes, len(header)) + header


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def stall_one(host: str, port: int, payload: memoryview, results: list[tuple[float, float]]) -> None:
    """Send the start of a 16 MiB frame and `payload` (15 MiB) then stall; record (first byte sent,
    connection closed by the broker) in monotonic seconds."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    try:
        writer.write(partial_frame_header(16 * MIB))
        for at in range(0, len(payload), 256 * 1024):
            writer.write(payload[at:at + 256 * 1024])
            await writer.drain()
        await reader.read()                      # EOF when the broker closes us
    except (ConnectionError, OSError):
        pass
    results.append((started, time.monotonic()))
    writer.close()


async def test_stalled_partial_frames_stay_bounded_and_are_closed_on_time(tmp_path: Path,
                                                                        client_api: ClientAPI) -> None:
    timeout_ms = 2_000
    settings = {"frame_read_timeout_ms": str(timeout_ms), "max_buffered_bytes": str(8 * MIB)}
    async with BrokerSubprocess(tmp_path / "store", settings=settings) as broker:
        host, port = broker.address.rsplit(":", 1)
        await send(client_api, broker.address, "warm")
        before = rss_bytes(broker.pid)
        payload = memoryview(bytes(15 * MIB))
        results: list[tuple[float, float]] = []
        stallers = [asyncio.create_task(stall_one(host, int(port), payload, results)) for _ in range(100)]
        peak = before
        async with asyncio.timeout(timeout_ms / 1000 + 20):
            while not all(t.done() for t in stallers):
                peak = max(peak, rss_bytes(broker.pid))
                await asyncio.sleep(0.02)
        await asyncio.gather(*stallers)
        assert peak < 100 * MIB, f"broker RSS went from {before / MIB:.0f} MB to {peak / MIB:.0f} MB"
        held_for = sorted(closed - started for started, closed in results)
        assert len(held_for) == 100
        # closed by the frame timeout: not before it, and within one check interval plus slack after
        assert held_for[0] >= timeout_ms / 1000 * 0.9, held_for[:3]
        assert held_for[-1] <= timeout_ms / 1000 + 3.0, held_for[-3:]
        result = await send(client_api, broker.address, "after")    # still serving
        assert result.queue_offset == 0


async def hold_two_then_be_refused(broker: Broker, client_api: ClientAPI, cap: str,
                                   reason: str) -> list[asyncio.StreamWriter]:
    """Open two raw connections (the cap), then check a third (the client API's) is refused with a
    remark naming `cap` and counted under `reason`; returns the two."""
    host, port = broker.address.rsplit(":", 1)
    held = [(await asyncio.open_connection(host, int(port)))[1] for _ in range(2)]
    await wait_until(lambda: len(broker.connection_guard.connections) == 2)
    with pytest.raises(ConnectionClosed, match=cap):
        await send(client_api, broker.address)
    assert broker.connection_guard.closed[reason] == 1
    return held


async def test_connection_past_max_connections_is_refused_with_a_reason(tmp_path: Path,
                                                                      client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, max_connections=2)) as broker:
        held = await hold_two_then_be_refused(broker, client_api, "max_connections 2", "refused")
        text = (await broker.metrics.render()).decode()
        assert 'rocketq_connections_closed{cluster="DefaultCluster",node_id="broker-a",reason="refused"} 1.0' in text
        held[0].close()
        await wait_until(lambda: len(broker.connection_guard.connections) == 1)
        assert (await send(client_api, broker.address)).queue_offset == 0
        held[1].close()


async def test_a_connection_sending_nothing_valid_is_closed(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, channel_expired_timeout_ms=400)) as broker:
        host, port = broker.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        started = time.monotonic()
        await send(client_api, broker.address)               # an active client, kept alive below
        while time.monotonic() - started < 0.8:
            await send(client_api, broker.address)
            await asyncio.sleep(0.05)
        async with asyncio.timeout(2):
            assert await reader.read() == b""
        assert broker.connection_guard.closed["expired"] == 1     # only the silent one
        await send(client_api, broker.address)
        writer.close()


async def test_reads_pause_past_max_buffered_bytes_while_small_requests_are_served(
        tmp_path: Path, client_api: ClientAPI) -> None:
    cap = 1 * MIB
    async with Broker(broker_config(tmp_path, max_buffered_bytes=cap, frame_read_timeout_ms=1_000)) as broker:
        host, port = broker.address.rsplit(":", 1)
        guard = broker.connection_guard
        payload = memoryview(bytes(8 * MIB))
        writers = []
        for _ in range(3):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(partial_frame_header(16 * MIB))
            writer.write(payload)                # the kernel holds what the broker does not read
            writers.append(writer)
        await wait_until(lambda: sum(c.channel.reading_paused for c in guard.connections.values()) == 3)
        peak = guard.buffered_bytes
        assert cap < peak < cap + 3 * MIB
        assert (await send(client_api, broker.address)).queue_offset == 0
        assert guard.buffered_bytes == peak                         # paused connections read nothing more
        # a paused connection is not polled, so its own close goes unseen: the frame deadline ends it
        await wait_until(lambda: guard.closed["frame_timeout"] == 3 and len(guard.connections) == 1, timeout_s=5)
        assert guard.buffered_bytes == 0
        for writer in writers:
            writer.transport.abort()


def test_rate_limited_log_suppresses_past_the_burst_and_says_how_many(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    limited = RateLimitedLog(logging.getLogger("test.ratelimit"), clock.monotonic_ms, burst=2, interval_ms=1_000)
    with caplog.at_level(logging.WARNING, "test.ratelimit"):
        for index in range(5):
            limited.warning("closing %d", index)
        limited.warning("refusing %d", 9)          # another template has its own budget
        clock.advance(1_000)
        limited.warning("closing %d", 5)           # the next line says how many were dropped
        for index in range(6, 9):
            limited.warning("closing %d", index)
        limited.flush()                             # the window has not ended: nothing yet
        clock.advance(1_000)
        limited.flush()                             # no later line came: a summary, once
        limited.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "closing 0", "closing 1", "refusing 9", "closing 5 (3 similar lines suppressed)", "closing 6",
        "2 similar lines suppressed in the last 1 s: closing %d"]


async def test_connections_past_max_connections_per_address_are_refused_with_a_reason(
        tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, max_connections_per_address=2)) as broker:
        held = await hold_two_then_be_refused(broker, client_api, "max_connections_per_address 2",
                                              "refused_per_address")
        # another loopback address is another peer: it still gets in
        host, port = broker.address.rsplit(":", 1)
        _, other = await asyncio.open_connection(host, int(port), local_addr=("127.0.0.2", 0))
        await wait_until(lambda: len(broker.connection_guard.connections) == 3)
        assert broker.connection_guard.per_address == {"127.0.0.1": 2, "127.0.0.2": 1}
        held[0].close()
        await wait_until(lambda: len(broker.connection_guard.connections) == 2)
        assert (await send(client_api, broker.address)).queue_offset == 0
        for writer in (held[1], other):
            writer.close()


GARBAGE = [b"\xff" * 64,                                        # frame_length past max_frame_bytes
           struct.pack(">II", 12, 200) + bytes(8),              # header_length past the frame
           struct.pack(">II", 8, 4) + b"\xc1\xc1\xc1\xc1",      # a header that is not msgpack
           struct.pack(">II", 2, 0)]                            # frame_length below 4


async def test_a_flood_of_garbage_connections_logs_a_bounded_amount(
        tmp_path: Path, client_api: ClientAPI, caplog: pytest.LogCaptureFixture) -> None:
    async with Broker(broker_config(tmp_path)) as broker:
        host, port = broker.address.rsplit(":", 1)

        async def garbage(payload: bytes) -> None:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(payload)
            try:
                async with asyncio.timeout(5):
                    while await reader.read(65_536):      # until the broker closes it
                        pass
            finally:
                writer.close()

        with caplog.at_level(logging.WARNING):
            for batch in range(10):
                await asyncio.gather(*(garbage(GARBAGE[(batch + i) % len(GARBAGE)]) for i in range(200)))
            assert (await send(client_api, broker.address)).queue_offset == 0
        logged = sum(len(record.getMessage()) for record in caplog.records)
        assert logged < 20_000, f"{len(caplog.records)} lines, {logged} bytes of log for 2,000 bad connections"
        assert any("protocol error" in record.getMessage() for record in caplog.records)
