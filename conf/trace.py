"""Message trace settings (`[trace]` of the broker, docs/operations/trace.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from conf.ranges import Range, check_ranges


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceConfig:
    """The broker records what happens to every message (sent, stored, delivered, committed, sent
    back, DLQ, resent, popped, acked, revived; a transaction's half, check-backs and outcome) into
    `<store>/trace/`, off the send and pull paths."""

    RANGES: ClassVar[Mapping[str, Range]] = MappingProxyType({
        "retention_hours": Range(low=1, high=100 * 365 * 24), "max_bytes": Range(low=4096),
        "segment_bytes": Range(low=1024, high=1 << 30), "queue_max_events": Range(low=1),
        "flush_interval_ms": Range(low=1, high=60_000)})

    enabled: bool = True                     # record trace events for every client (no client configuration)
    retention_hours: int = 72                # trace segments older than this are deleted
    max_bytes: int = 1 << 30                 # trace files on disk; past it the oldest segments are deleted
    segment_bytes: int = 16 << 20            # one trace file; a full one is closed and a new one started
    queue_max_events: int = 100_000          # events waiting to be written; past it new ones are dropped and counted
    flush_interval_ms: int = 100             # how often waiting events are written to the trace files

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES)
