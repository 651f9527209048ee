"""The "heartbeat flood" chaos fault runs against a broker process and reports what it measured."""

from __future__ import annotations

from pathlib import Path

from broker.process import BrokerSubprocess
from chaos.heartbeat_flood import heartbeat_flood


async def test_the_heartbeat_flood_fault_reports_what_it_measured(tmp_path: Path) -> None:
    """chaos/heartbeat_flood.py for ~2 s against a broker process at its default bounds."""
    async with BrokerSubprocess(tmp_path / "store") as broker:
        result = await heartbeat_flood(broker.address, tmp_path / "store", 2.0, pid=broker.pid, client_ids=300)
    assert result.client_ids == 300 and result.heartbeats >= 600
    assert 0 < result.accepted <= result.heartbeats // 3 < result.refused     # 100 client ids per host
    assert result.notices >= 100 and result.sends > 10 and result.peak_rss_bytes > 0
    # the probe shares the fault's loop with its fake clients (see tests/broker/test_heartbeat_flood.py)
    assert result.p99_send_ms < 250, f"p99 send {result.p99_send_ms:.1f} ms"
