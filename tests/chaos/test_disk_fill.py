"""Fault kind "disk filled by another process on a tmpfs", for a few seconds: the broker refuses
sends with SERVICE_NOT_AVAILABLE (never SIGBUS), loses nothing acknowledged, resumes once space is
freed, and starts again on the full file system (mounting the tmpfs needs root; skipped otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.process import BrokerSubprocess
from chaos.disk_fill import SMALL_STORE_SETTINGS, disk_fill
from tests.broker.test_disk_full import small_disk


@pytest.mark.timeout(90)
async def test_a_disk_filled_under_a_sending_broker_is_survived(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 16 << 20) as disk:
        async with BrokerSubprocess(disk / "store", settings=SMALL_STORE_SETTINGS) as broker:
            result = await disk_fill(broker, duration_s=3.0, filler_dir=disk, acknowledged_before_fill=101)
    assert result.crashed == 0 and result.restarted_when_full, result
    assert result.acknowledged > 100 and result.refused > 100, result
    assert "No space left on device" in result.refusal_remark or "past disk_space" in result.refusal_remark, result
    assert result.resumed_after_free_ms < 5_000, result
    assert result.lost_after_free == 0 and result.lost_after_restart == 0, result
