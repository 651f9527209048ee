"""Store configuration: where the commit log and consume queues live and how they are flushed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

FlushDiskType = Literal["SYNC_FLUSH", "ASYNC_FLUSH"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Mirrors RocketMQ's `MessageStoreConfig` where a field has a counterpart.

    Deliberate difference (PROTOCOL.md §1): `flush_disk_type` defaults to SYNC_FLUSH with group
    commit; ASYNC_FLUSH acknowledges before fsync and can lose the last `flush_interval_ms` of
    acknowledged sends if the machine (not just the process) dies.
    """

    path: Path = Path("store")                         # commit log, consume queues and broker state
    # 32 MiB, not RocketMQ's 1 GiB (mappedFileSizeCommitLog): on ext4, an fdatasync of a file
    # written by small appends costs ~150 µs through its first ~32 MiB and ~500 µs past them
    # (measured here, preallocated or sparse), and SYNC_FLUSH pays one per group commit.
    # An existing store keeps the size its files were created with (CommitLog.load).
    commit_log_segment_bytes: int = 32 << 20
    consume_queue_segment_units: int = 300_000         # 20-byte units per consume-queue file
    flush_disk_type: FlushDiskType = "SYNC_FLUSH"      # when a send is acknowledged: after its fsync, or before
    flush_interval_ms: int = 500                       # ASYNC_FLUSH commit-log flush period
    flush_consume_queue_interval_ms: int = 1_000       # flushIntervalConsumeQueue
    sync_flush_timeout_ms: int = 5_000                 # syncFlushTimeout → FLUSH_DISK_TIMEOUT
    max_message_bytes: int = 4 * 1024 * 1024           # maxMessageSize, 4 MiB
    access_message_in_memory_max_ratio: int = 40       # % of RAM behind the log end counted "in memory"
    max_transfer_count_on_message_in_memory: int = 32  # most messages returned by one pull
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024   # most bytes returned by one pull
    # delay levels 1..18 of delayed messages and consumer retries (level 3 = 10s is the first retry)
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    file_reserved_time_hours: int = 72                 # fileReservedTime: commit-log files kept this long
    delete_when: str = "04"                            # deleteWhen: local hours ("04;05") or "*" for retention
    disk_max_used_space_ratio: int = 75                # diskMaxUsedSpaceRatio %: past it, oldest files go
    disk_space_warning_level_ratio: int = 90           # diskSpaceWarningLevelRatio %: past it, sends refused
    clean_resource_interval_ms: int = 10_000           # cleanResourceInterval: how often retention runs
    key_index_max_entries: int = 1_000_000             # keys kept for QUERY_MESSAGE (in memory, 40 bytes each)
    disk_check_interval_ms: int = 1_000                # how often disk use is sampled (refuse / resume sends)
    # a DEDUP send is stored once per (producer group, UNIQ_KEY) within this window; 0: off
    dedup_window_ms: int = 0
    dedup_max_entries: int = 1_000_000                 # DEDUP sends remembered (~250 bytes each, in memory)
