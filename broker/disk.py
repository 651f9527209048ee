"""Disk use of the store: one small helper shared by metrics, `broker status` and the reliability
work (retention and disk-full checks read the same numbers).

`disk_usage(path)` is the file system holding `path` (statvfs through `shutil.disk_usage`);
`directory_bytes(path)` is what the store's own files take on disk (allocated blocks, summed by
walking the tree; a file removed during the walk is skipped). Both are blocking: call them from a thread or at
scrape time, never on a hot path."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """The file system holding a path, in bytes; `used_ratio` is used / total (0.0 .. 1.0), as
    RocketMQ's `diskMaxUsedSpaceRatio` checks compare it."""

    total_bytes: int
    used_bytes: int
    free_bytes: int

    @property
    def used_ratio(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


def disk_usage(path: Path) -> DiskUsage:
    """Usage of the file system holding `path` (or its nearest existing parent); raises `OSError`
    only when no parent exists at all."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return DiskUsage(total_bytes=usage.total, used_bytes=usage.used, free_bytes=usage.free)


def directory_bytes(path: Path) -> int:
    """Bytes allocated on disk to the files under `path` (`st_blocks` * 512; 0 when it does not
    exist). Segment files are sized up front but sparse, so this is close to the bytes written."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total
