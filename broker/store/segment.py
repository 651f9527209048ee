"""Fixed-size memory-mapped files named by their start byte offset (RocketMQ's `MappedFile` and
`MappedFileQueue`), shared by the commit log and the consume queues.

A file `00000000000000065536` of a 65,536-byte log holds bytes [65536, 131072). Files are created at
full size with `ftruncate` (sparse, reads as zeros); writes are slice assignments into the mmap and
reads are memoryview slices of it, so both are zero-copy. Durability is `os.fdatasync` on the file,
which callers run in a thread (`flush_paths` says which files a byte range touches).

A write into a mapped page the file system cannot back (a full disk) is a SIGBUS that kills the
process, so no byte is written through a map before its blocks are allocated: commit-log files
whole when created (`preallocate`), other files `ALLOCATE_CHUNK_BYTES` at a time ahead of their
writes (`Segment.allocate_through`), where a full disk is an `OSError` the caller refuses with.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from pathlib import Path

log = logging.getLogger(__name__)

NAME_DIGITS = 20
_ZERO_CHUNK_BYTES = 1 << 20
ALLOCATE_CHUNK_BYTES = 64 << 10      # blocks given to a consume-queue file ahead of its writes (3,276 units)


def segment_files(directory: Path) -> list[Path]:
    """The files of `directory` named as segments (20 digits), in offset order; none when it does
    not exist. Other names are left out."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if len(p.name) == NAME_DIGITS and p.name.isdigit())


def segment_name(start_offset: int) -> str:
    """`start_offset` zero-padded to 20 digits (RocketMQ `UtilAll.offset2FileName`)."""
    return f"{start_offset:0{NAME_DIGITS}d}"


class Segment:
    """One mapped file: bytes [start_offset, start_offset + size) of its log. `view` is a writable
    memoryview of the whole map; slices of it stay valid until `close()` (and keep the map alive
    after it, see `close`). `allocated`: bytes [0, allocated) are known to have disk blocks (a
    loaded file starts at 0: unknown, `allocate_through` is then a cheap no-op for what it has)."""

    __slots__ = ("allocated", "mm", "path", "size", "start_offset", "view")

    def __init__(self, path: Path, start_offset: int, size: int, *, preallocate: bool = False) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        created = False
        self.allocated = 0
        try:
            actual = os.fstat(fd).st_size
            if actual not in (0, size):      # 0: created but not yet sized when the process died
                raise ValueError(f"{path} has {actual} bytes, not the configured segment size {size}")
            if actual == 0:
                created = True
                os.ftruncate(fd, size)
                if preallocate:
                    _preallocate(fd, 0, size)
                # The first write fault into a new file's mapping allocates its first block and was
                # measured at 5-15 ms on ext4 here (every new consume queue stalled the loop);
                # writing the first page through the file instead costs microseconds.
                os.pwrite(fd, bytes(min(size, _FIRST_PAGE_BYTES)), 0)
                self.allocated = size if preallocate else min(size, _FIRST_PAGE_BYTES)
            self.mm = mmap.mmap(fd, size)      # dups the fd; ours is closed below
        except OSError:
            if created:                       # e.g. ENOSPC: leave no half-made file behind
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        finally:
            os.close(fd)
        self.path, self.start_offset, self.size = path, start_offset, size
        self.view = memoryview(self.mm)

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    def allocate_through(self, end: int) -> None:
        """Give bytes [0, end) of this file disk blocks (up to the next `ALLOCATE_CHUNK_BYTES`
        boundary, within the file) before they are written through the map. Raises `OSError`
        (ENOSPC, EIO; nothing allocated then) where a write through the map would have been a
        SIGBUS. A file system without fallocate is tolerated (`_preallocate`)."""
        if end <= self.allocated:
            return
        new_end = min(self.size, -(-end // ALLOCATE_CHUNK_BYTES) * ALLOCATE_CHUNK_BYTES)
        fd = os.open(self.path, os.O_RDWR)
        try:
            _preallocate(fd, self.allocated, new_end - self.allocated)
        finally:
            os.close(fd)
        self.allocated = new_end

    def zero_from(self, position: int, written_end: int | None = None) -> None:
        """Zero bytes [position, size) of this file (positions relative to the file), writing only
        chunks that are not already zero so a sparse tail stays sparse; bytes from `written_end`
        on are known zero and not even read (a hole read through the map on a full tmpfs is a
        SIGBUS)."""
        view = self.view
        limit = self.size if written_end is None else min(self.size, max(written_end, position))
        while position < limit:
            end = min(position + _ZERO_CHUNK_BYTES, limit)
            if view[position:end].tobytes().count(0) != end - position:
                view[position:end] = bytes(end - position)
            position = end

    def try_close(self) -> bool:
        """Unmap now, unless a caller still holds a slice of `view` (a pull response not yet
        written): then nothing changes and False is returned (retention retries later)."""
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            self.view = memoryview(self.mm)
            return False
        return True

    def close(self) -> None:
        """Unmap. If a caller still holds a slice of `view` (e.g. a pull response not yet written),
        the map cannot be closed now; it is then unmapped when the last slice is released."""
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            log.debug("segment %s still has readers; unmapped when they are released", self.path)


_FIRST_PAGE_BYTES = 4096


def _preallocate(fd: int, offset: int, length: int) -> None:
    """Reserve the blocks of bytes [offset, offset + length) up front: a write fault into a sparse
    shared mapping allocates a block each time (measured ~6x slower appends on ext4), and on a full
    disk that fault is a SIGBUS, whereas this fails cleanly. Raises `OSError` for ENOSPC, EIO and
    the like; a file system without fallocate is tolerated."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        log.debug("posix_fallocate not supported here: %s", exc)


def fdatasync_paths(paths: list[Path]) -> None:
    """fdatasync each file: blocking, so callers run it with `asyncio.to_thread`. Dirty pages of a
    shared mapping belong to the file's page cache, so a fresh descriptor flushes them."""
    for path in paths:
        fd = os.open(path, os.O_RDWR)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)


class MappedSegments:
    """The ordered segments of one log in `directory`, each `segment_bytes` long and starting at a
    multiple of it. Lookup by byte offset is O(1). Missing files in the middle are allowed (a reader
    then finds no segment); nothing is created until `get_or_create`, which `preallocate`s the
    blocks of a new file when asked (the commit log does)."""

    def __init__(self, directory: Path, segment_bytes: int, *, preallocate: bool = False) -> None:
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
        self.directory, self.segment_bytes, self._preallocate = directory, segment_bytes, preallocate
        self.segments: list[Segment] = []
        self._by_start: dict[int, Segment] = {}

    def load(self) -> None:
        """Map every segment file already in `directory` (none if it does not exist); other names
        are ignored with a warning. Raises `ValueError` for a segment whose name or size does not
        fit `segment_bytes` (the configured size changed): ignoring it would lose its data."""
        if not self.directory.is_dir():
            return
        paths = []
        for path in sorted(self.directory.iterdir()):
            name = path.name
            if len(name) != NAME_DIGITS or not name.isdigit():
                log.warning("ignoring unexpected file %s", path)
                continue
            if int(name) % self.segment_bytes or path.stat().st_size not in (0, self.segment_bytes):
                raise ValueError(f"{path} does not fit the configured segment size {self.segment_bytes}; "
                                 "was the size changed?")
            paths.append(path)
        for path in paths:                   # map only once every file was checked
            self._add(Segment(path, int(path.name), self.segment_bytes))

    def existing_segment_bytes(self) -> int | None:
        """The size of the segment files already in `directory` when they all have one size (files
        of 0 bytes, created but not yet sized, do not count); None when there are none or their
        sizes differ (`load` then says which file does not fit)."""
        sizes = {path.stat().st_size for path in segment_files(self.directory)} - {0}
        return sizes.pop() if len(sizes) == 1 else None

    def _add(self, segment: Segment) -> None:
        self._by_start[segment.start_offset] = segment
        self.segments.append(segment)
        self.segments.sort(key=lambda s: s.start_offset)

    def find(self, offset: int) -> Segment | None:
        """The segment holding byte `offset`, or None."""
        return self._by_start.get(offset - offset % self.segment_bytes)

    @property
    def first(self) -> Segment | None:
        return self.segments[0] if self.segments else None

    @property
    def last(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def min_offset(self) -> int:
        """Start of the first segment, 0 when there is none."""
        return self.segments[0].start_offset if self.segments else 0

    def get_or_create(self, start_offset: int) -> Segment:
        """The segment starting at `start_offset` (a multiple of `segment_bytes`), created if absent."""
        segment = self._by_start.get(start_offset)
        if segment is None:
            if start_offset % self.segment_bytes:
                raise ValueError(f"{start_offset} is not a multiple of {self.segment_bytes}")
            self.directory.mkdir(parents=True, exist_ok=True)
            segment = Segment(self.directory / segment_name(start_offset), start_offset, self.segment_bytes,
                              preallocate=self._preallocate)
            self._add(segment)
        return segment

    def truncate(self, offset: int, *, zero: bool = True, written_end: int | None = None) -> None:
        """Drop every byte at or after `offset`: zero the rest of the segment holding it (unless
        `zero` is False: the caller knows it is zero; up to `written_end` when the caller knows
        nothing was written after it) and delete the segments after it (RocketMQ
        `truncateDirtyFiles`)."""
        holder = self.find(offset)
        if holder is not None and zero:
            holder.zero_from(offset - holder.start_offset,
                             None if written_end is None else written_end - holder.start_offset)
        for segment in [s for s in self.segments if s.start_offset > offset]:
            log.warning("deleting segment %s after offset %d", segment.path, offset)
            self.segments.remove(segment)
            del self._by_start[segment.start_offset]
            segment.close()
            with contextlib.suppress(FileNotFoundError):
                segment.path.unlink()

    def delete_first(self) -> bool:
        """Delete the first segment (retention); False, keeping it, when a reader still holds a
        slice of it. Raises `OSError` if the file cannot be removed (it is then unmapped and
        forgotten all the same, as its data is gone for readers)."""
        segment = self.segments[0]
        if not segment.try_close():
            return False
        del self.segments[0]
        del self._by_start[segment.start_offset]
        segment.path.unlink(missing_ok=True)
        return True

    def paths_between(self, from_offset: int, to_offset: int) -> list[Path]:
        """Files holding any byte of [from_offset, to_offset): what an fsync of that range covers.
        Looks up only the files of the range (a SYNC_FLUSH round asks for one or two of them)."""
        if to_offset <= from_offset:
            return []
        size = self.segment_bytes
        found = (self._by_start.get(start) for start in range(from_offset - from_offset % size, to_offset, size))
        return [segment.path for segment in found if segment is not None]

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self.segments.clear()
        self._by_start.clear()
