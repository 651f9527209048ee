"""`DiskGuard`: whether the store takes writes (RocketMQ `RunningFlags` disk-full / write-error bits,
set by `CleanCommitLogService.isSpaceFull` and by failed writes). Pure: callers pass disk samples
(`broker.disk.DiskUsage`) and write errors in.

Sends are refused (SERVICE_NOT_AVAILABLE, `refusal` as the remark) while either holds:
- the last sample was at or past `disk_space_warning_level_ratio` % used; it clears on a sample
  below it;
- a commit-log write or fsync failed with an `OSError` (ENOSPC, EIO, ...); it clears on the first
  later sample that is below the warning level with at least `min_free_bytes` free (the room the
  next commit-log file needs), so sends resume by themselves once space is back. An EIO that
  persists simply sets it again on the next failed write.
Pulls never consult it."""

from __future__ import annotations

import errno
import logging
import os

from broker.disk import DiskUsage

log = logging.getLogger(__name__)


class DiskGuard:
    def __init__(self, *, warning_ratio_percent: int, min_free_bytes: int) -> None:
        self._warning_ratio = warning_ratio_percent / 100
        self.min_free_bytes = min_free_bytes
        self._full: str | None = None           # from the last sample
        self._error: str | None = None          # from a failed write, until space is back
        self.last_usage: DiskUsage | None = None

    @property
    def refusal(self) -> str | None:
        """Why sends are refused now, written for the client; None when the store is writable."""
        return self._error or self._full

    def observe(self, usage: DiskUsage) -> None:
        """Take a new sample of the store's file system."""
        self.last_usage = usage
        ratio = usage.used_ratio
        if ratio >= self._warning_ratio:
            if self._full is None:
                log.error("store disk %.1f%% used, past disk_space_warning_level_ratio %d%%: refusing sends",
                          ratio * 100, round(self._warning_ratio * 100))
            self._full = (f"store not writable: disk {ratio:.1%} used, past disk_space_warning_level_ratio "
                          f"{self._warning_ratio:.0%}; sends resume once space is freed")
        elif self._full is not None:
            log.warning("store disk %.1f%% used: accepting sends again", ratio * 100)
            self._full = None
        if self._error is not None and ratio < self._warning_ratio and usage.free_bytes >= self.min_free_bytes:
            log.warning("store disk has %d bytes free after a write error: accepting sends again",
                        usage.free_bytes)
            self._error = None

    def write_failed(self, exc: OSError, what: str) -> str:
        """Record a failed write or fsync (`what` names it); returns the refusal remark."""
        name = errno.errorcode.get(exc.errno or 0, "error")
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if self._error is None:
            log.error("store not writable: %s failed: %s", what, exc)
        self._error = (f"store not writable: {what} failed with {name} ({reason}); nothing of this "
                       f"send was acknowledged; sends resume once the disk has space again")
        return self._error
