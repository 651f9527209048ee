"""Fault kind "kill -9 within 1 s of a topic create", for a few seconds: nothing created or
acknowledged before a kill is missing after the restart."""

from __future__ import annotations

from pathlib import Path

from broker.process import BrokerSubprocess
from chaos.topic_create_kill import topic_create_kill


async def test_kill_9_right_after_topic_creates_loses_no_topic_and_no_message(tmp_path: Path) -> None:
    async with BrokerSubprocess(tmp_path / "store", settings={"store.commit_log_segment_bytes": "1048576",
                                                              "store.consume_queue_segment_units": "1000"}) as broker:
        result = await topic_create_kill(broker, duration_s=3.0, min_cycles=2)
    assert result.cycles >= 2 and result.acknowledged >= 20 * result.cycles, result
    assert result.kill_after_create_ms < 1_000, result
    assert result.topics_lost == 0 and result.lost == 0, result
