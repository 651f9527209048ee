"""Fault kind "unread pulls" (chaos/unread_pulls.py) against a broker subprocess, for ~2 s: the
broker's memory stays within its buffer cap while connections never read the responses to their
pipelined pulls, another client is served meanwhile, and the memory comes back once they close."""

from __future__ import annotations

from pathlib import Path

from broker.process import BrokerSubprocess
from chaos.unread_pulls import unread_pulls

MIB = 1024 * 1024
CAP = 32 * MIB


async def test_unread_pulls_stay_within_the_buffer_cap_and_their_memory_comes_back(tmp_path: Path) -> None:
    settings = {"max_buffered_bytes": str(CAP), "store.flush_disk_type": "ASYNC_FLUSH"}
    async with BrokerSubprocess(tmp_path / "store", settings=settings) as broker:
        report = await unread_pulls(broker.address, broker.pid, duration_s=2.0, connections=10,
                                    pulls_per_connection=500, messages=300, message_bytes=150 * 1024)
    grew = report.peak_rss_bytes - report.baseline_rss_bytes
    # 10 x 500 pulls of up to 256 KiB each would be 1.2 GB of responses; the cap holds them to
    # max_buffered_bytes plus about one response per connection and the waiting requests' bytes
    assert grew < CAP + 48 * MIB, f"broker RSS grew {grew / MIB:.0f} MB over the fault"
    assert report.probe_failures == 0 and report.probe_round_trips >= 20, report
    assert report.probe_p99_ms < 1_000, report
    left = report.after_rss_bytes - report.baseline_rss_bytes
    assert left < 100 * MIB, f"{left / MIB:.0f} MB still held {report.settled_after_s:.1f} s after the close"
