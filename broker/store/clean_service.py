"""Retention and disk watching: RocketMQ's `CleanCommitLogService` + `CleanConsumeQueueService`.

Every `disk_check_interval_ms` the store's file system is sampled (`broker.disk.disk_usage`, in a
thread) into the `DiskGuard`, which refuses sends past `disk_space_warning_level_ratio` and clears
a write-error refusal once space is back. Every `clean_resource_interval_ms` retention runs:

- Commit-log files are considered oldest first, at most `DELETE_FILES_BATCH_MAX` (10) per round.
  A file goes when it was last modified more than `file_reserved_time_hours` ago and the local
  hour is in `delete_when` ("04", "04;05", or "*" for any hour), or, regardless of age and hour,
  while disk use is at or past `disk_max_used_space_ratio` (re-sampled after each deletion, so
  only what is needed goes). Never deleted: the last file (being written), a file not wholly
  flushed and dispatched to consume queues, a file a pull still holds a view of (retried next
  round). RocketMQ deletes every eligible file once past its forcible ratio; we stop as soon as
  use is back under the ratio.
- Then every consume queue drops its leading files whose units all point below the commit log's
  new start (never its last file nor one with unflushed units) and moves `min_offset` to the first
  unit still in the commit log. A pull below it is answered PULL_OFFSET_MOVED with the new minimum
  as `next_begin_offset` (REFERENCE.md §2.1, OFFSET_TOO_SMALL), so consumers behind move there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from broker.disk import DiskUsage, disk_usage
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import ConsumeQueueTable
from broker.store.disk_guard import DiskGuard
from conf.store import StoreConfig
from protocol.service import Service

log = logging.getLogger(__name__)

DELETE_FILES_BATCH_MAX = 10
_HOUR_MS = 3_600_000


def is_time_to_delete(delete_when: str, hour: int) -> bool:
    """True when `hour` (0..23, local) is one of `delete_when`'s ";"-separated hours, or it is "*".
    Unparsable entries are ignored (RocketMQ `UtilAll.isItTimeToDo`)."""
    for entry in delete_when.split(";"):
        entry = entry.strip()
        if entry == "*":
            return True
        if entry.isdigit() and int(entry) == hour:
            return True
    return False


@dataclass(frozen=True, slots=True)
class CleanResult:
    commit_log_files: int         # commit-log files deleted this round
    consume_queue_files: int      # consume-queue files deleted this round


class CleanService(Service):
    name = "clean"

    def __init__(self, config: StoreConfig, commit_log: CommitLog, consume_queues: ConsumeQueueTable,
                 guard: DiskGuard, *, safe_end: Callable[[], int], clock_ms: Callable[[], int],
                 sample: Callable[[Path], DiskUsage] = disk_usage,
                 after_check: Callable[[], Awaitable[None]] | None = None) -> None:
        """`safe_end()`: the commit-log offset before which everything is flushed and dispatched.
        `clock_ms()`: epoch ms, compared with file modification times and for the local hour.
        `after_check()`: awaited after each periodic disk check (work waiting for disk space)."""
        super().__init__()
        self._config, self._commit_log, self._consume_queues = config, commit_log, consume_queues
        self._guard, self._safe_end, self._clock_ms, self._sample = guard, safe_end, clock_ms, sample
        self._after_check = after_check

    async def check_disk(self) -> DiskUsage:
        """Sample disk use into the guard (refuse or resume sends); returns the sample."""
        usage = await asyncio.to_thread(self._sample, self._config.path)
        self._guard.observe(usage)
        return usage

    async def run(self) -> None:
        config = self._config
        next_clean_s = time.monotonic() + config.clean_resource_interval_ms / 1000
        while await self.wait(config.disk_check_interval_ms):
            try:
                usage = await self.check_disk()
                if self._after_check is not None:
                    await self._after_check()
                if time.monotonic() >= next_clean_s:
                    next_clean_s = time.monotonic() + config.clean_resource_interval_ms / 1000
                    self.clean(usage)
            except OSError as exc:
                log.error("disk check or retention failed: %s", exc)

    def clean(self, usage: DiskUsage) -> CleanResult:
        """One retention round with the disk sample `usage` (see the module docstring)."""
        config = self._config
        now_ms = self._clock_ms()
        max_ratio = config.disk_max_used_space_ratio / 100
        space_full = usage.used_ratio >= max_ratio
        time_up = is_time_to_delete(config.delete_when, time.localtime(now_ms / 1000).tm_hour)
        reserved_ms = config.file_reserved_time_hours * _HOUR_MS
        commit_log_files = 0
        while commit_log_files < DELETE_FILES_BATCH_MAX and (time_up or space_full):
            segment = self._commit_log.oldest_deletable(self._safe_end())
            if segment is None:
                break
            age_ms = now_ms - int(segment.path.stat().st_mtime * 1000)
            if not space_full and age_ms < reserved_ms:
                break
            path = segment.path
            if not self._commit_log.delete_oldest():
                log.info("retention: %s is still being read; retrying next round", path)
                break
            commit_log_files += 1
            log.info("retention: deleted commit-log file %s (%s)", path,
                     f"disk {usage.used_ratio:.1%} used, past disk_max_used_space_ratio {max_ratio:.0%}"
                     if space_full else f"last written {age_ms // _HOUR_MS} h ago")
            if space_full:
                usage = self._sample(config.path)
                space_full = usage.used_ratio >= max_ratio
        consume_queue_files = 0
        if commit_log_files:
            min_offset = self._commit_log.min_offset
            for queue in self._consume_queues.queues.values():
                consume_queue_files += queue.delete_files_below(min_offset)
            log.info("retention: commit log now starts at %d; %d consume-queue files deleted",
                     min_offset, consume_queue_files)
        return CleanResult(commit_log_files, consume_queue_files)
