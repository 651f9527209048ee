"""Consume queues: per (topic, queue_id), the index of that queue's messages in the commit log
(RocketMQ `ConsumeQueue`). Synchronous.

Files live in `<store>/consumequeue/<topic>/<queue_id>/`, each `units_per_segment` * 20 bytes,
named by their start byte offset within the queue. A unit is `>QIq`: commit_log_offset (u64),
size (u32, the record's total size), tags_code (i64). Unit `queue_offset` sits at byte
`queue_offset * 20`. A unit with size 0 is unwritten (the end); a BLANK unit (0, 0x7FFFFFFF, 0)
fills the positions before a queue's first unit when that unit's queue_offset is not 0.

Units are written through the files' maps only where blocks were allocated first
(`Segment.allocate_through`, 64 KiB at a time); the put path reserves a message's unit
(`ConsumeQueue.reserve`) before its record is appended, so a consume queue with no room on a full
disk refuses the send (nothing stored) instead of faulting (SIGBUS) when the unit is written.
"""

from __future__ import annotations

import errno
import functools
import logging
import mmap
import os
import re
import struct
from collections.abc import Callable
from itertools import chain
from pathlib import Path

from broker.store.segment import MappedSegments, Segment
from protocol import native

log = logging.getLogger(__name__)

CQ_UNIT = struct.Struct(">QIq")
UNIT_BYTES = CQ_UNIT.size
BLANK_SIZE = 0x7FFFFFFF
_BLANK_UNIT = CQ_UNIT.pack(0, BLANK_SIZE, 0)
_UNIT_SIZE = struct.Struct(">I")
_TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def write_units_py(buffer: mmap.mmap | bytearray, position: int, units: list[tuple[int, int, int]]) -> bool:
    """Write `units` ((commit_log_offset, size, tags_code) each) as consecutive consume-queue units
    from byte `position` of `buffer`; raises `struct.error` for a value outside its field or a run
    that does not fit. Returns True. The reference of `broker.store._records.write_units` (C)."""
    _run_struct(len(units)).pack_into(buffer, position, *chain.from_iterable(units))
    return True


_records = native.load("broker.store._records")
_c_write_units: Callable[[mmap.mmap | bytearray, int, list[tuple[int, int, int]]], bool] | None = (
    _records.write_units if _records is not None else None)


def write_units(buffer: mmap.mmap | bytearray, position: int, units: list[tuple[int, int, int]]) -> None:
    """`write_units_py`, in C when `broker.store._records` was built (no three arguments per unit to
    unpack, a tenth of the time for a batch of 32); anything unusual takes the Python version."""
    if _c_write_units is None or not _c_write_units(buffer, position, units):
        write_units_py(buffer, position, units)


@functools.lru_cache(maxsize=64)
def _run_struct(count: int) -> struct.Struct:
    """The layout of `count` consecutive units (one `pack_into` for a batch's run)."""
    return struct.Struct(">" + "QIq" * count)


def is_valid_topic_name(topic: str) -> bool:
    """True for names safe as a directory name: `^[%|a-zA-Z0-9_-]+$` (no dots, no separators)."""
    return _TOPIC_NAME.match(topic) is not None


class ConsumeQueue:
    """`min_offset` is the first readable queue offset; `max_offset` the next one to be written;
    `max_commit_log_end` the commit-log end (offset + size) of the last unit (0 when empty).
    Raises `ValueError` at creation for a topic name that fails `is_valid_topic_name` or a negative
    queue_id, so no path is built from an unchecked name."""

    __slots__ = ("_flushed_bytes", "_segments", "allocated_units", "max_commit_log_end", "max_offset",
                 "min_offset", "queue_id", "topic", "units_per_segment")

    def __init__(self, root: Path, topic: str, queue_id: int, units_per_segment: int) -> None:
        if not is_valid_topic_name(topic):
            raise ValueError(f"topic name {topic!r} is not allowed in a path")
        if queue_id < 0:
            raise ValueError(f"queue_id must be >= 0, got {queue_id}")
        self.topic, self.queue_id, self.units_per_segment = topic, queue_id, units_per_segment
        self._segments = MappedSegments(root / topic / str(queue_id), units_per_segment * UNIT_BYTES)
        self.min_offset = self.max_offset = self.max_commit_log_end = 0
        self._flushed_bytes = 0
        self.allocated_units = 0           # units [.., this) of the queue's last file have blocks
        # (read by the store's one-message put, which calls `reserve` only past it)

    def reserve(self, queue_offset: int, count: int = 1) -> None:
        """Give units [queue_offset, queue_offset + count) disk blocks now (creating their files),
        so writing them later cannot fault; raises `OSError` (ENOSPC, EIO), having written
        nothing. O(1) while they are within what the last call reserved."""
        end = queue_offset + count
        if end <= self.allocated_units:
            return
        segments, per_file = self._segments, self.units_per_segment
        start = max(queue_offset, self.allocated_units)
        while start < end:
            file_start = start - start % per_file
            file_end = min(end, file_start + per_file)
            segment = segments.get_or_create(file_start * UNIT_BYTES)
            segment.allocate_through((file_end - file_start) * UNIT_BYTES)
            self.allocated_units = file_start + segment.allocated // UNIT_BYTES
            start = file_end

    def load(self) -> None:
        """Map existing files; find `max_offset` (after the last written unit of the last non-empty
        file) and `min_offset` (after the leading BLANK units of the first file)."""
        segments = self._segments
        segments.load()
        if not segments.segments:
            return
        end_bytes = segments.min_offset
        for segment in reversed(segments.segments):
            written = _written_bytes(segment)
            if written:
                end_bytes = segment.start_offset + written
                break
        self.max_offset = end_bytes // UNIT_BYTES
        first = segments.segments[0]
        self.min_offset = first.start_offset // UNIT_BYTES
        for _, size, _ in CQ_UNIT.iter_unpack(first.view):
            if size != BLANK_SIZE or self.min_offset >= self.max_offset:
                break
            self.min_offset += 1
        self._set_max_commit_log_end()
        self._flushed_bytes = self.max_offset * UNIT_BYTES

    def _set_max_commit_log_end(self) -> None:
        unit = self.unit_at(self.max_offset - 1) if self.max_offset > self.min_offset else None
        self.max_commit_log_end = unit[0] + unit[1] if unit is not None and unit[1] != BLANK_SIZE else 0

    def append(self, commit_log_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Write the unit for `queue_offset`. False (nothing written) for a duplicate, i.e. a
        `queue_offset` below `max_offset` (a re-dispatch after restart). A gap (queue_offset above
        `max_offset`) is filled with BLANK units and logged; the first unit of an empty queue may
        start anywhere, the units before it in its file become BLANK (RocketMQ pre-fills them)."""
        max_offset = self.max_offset
        if queue_offset < max_offset:
            return False
        if queue_offset > max_offset:
            if max_offset == 0:
                start = queue_offset - queue_offset % self.units_per_segment
                self.min_offset = queue_offset
            else:
                start = max_offset
                log.warning("consume queue %s:%d: gap %d..%d filled with blank units",
                            self.topic, self.queue_id, max_offset, queue_offset)
            for blank_offset in range(start, queue_offset):
                self._write_unit(blank_offset, _BLANK_UNIT)
        position = queue_offset * UNIT_BYTES
        segment = self._segments.find(position)
        if segment is None:
            segment = self._segments.get_or_create(position - position % self._segments.segment_bytes)
        relative = position - segment.start_offset
        if relative + UNIT_BYTES > segment.allocated:
            segment.allocate_through(relative + UNIT_BYTES)
        CQ_UNIT.pack_into(segment.mm, relative, commit_log_offset, size, tags_code)
        self.max_offset = queue_offset + 1
        self.max_commit_log_end = commit_log_offset + size
        return True

    def append_run(self, queue_offset: int, units: list[tuple[int, int, int]]) -> bool:
        """Write consecutive units from `queue_offset` (a batch's messages) in one go when they
        follow the queue's end inside the current file; False, writing nothing, otherwise (the
        caller appends them one by one)."""
        count = len(units)
        position = queue_offset * UNIT_BYTES
        segment = self._segments.find(position) if queue_offset == self.max_offset and count else None
        if segment is None or position + count * UNIT_BYTES > segment.end_offset:
            return False
        relative = position - segment.start_offset
        if relative + count * UNIT_BYTES > segment.allocated:
            segment.allocate_through(relative + count * UNIT_BYTES)
        write_units(segment.mm, relative, units)
        self.max_offset = queue_offset + count
        last_offset, last_size, _ = units[-1]
        self.max_commit_log_end = last_offset + last_size
        return True

    def _write_unit(self, queue_offset: int, unit: bytes) -> None:
        position = queue_offset * UNIT_BYTES
        segment = self._segments.get_or_create(position - position % self._segments.segment_bytes)
        relative = position - segment.start_offset
        if relative + UNIT_BYTES > segment.allocated:
            segment.allocate_through(relative + UNIT_BYTES)
        segment.view[relative:relative + UNIT_BYTES] = unit

    def read_units(self, queue_offset: int, max_units: int) -> memoryview | None:
        """The raw units from `queue_offset` to the written end of the file holding it, at most
        `max_units` of them (never crossing a file boundary: one pull reads one file). None when no
        file holds `queue_offset` (RocketMQ's null index buffer → OFFSET_FOUND_NULL)."""
        position = queue_offset * UNIT_BYTES
        segment = self._segments.find(position)
        if segment is None:
            return None
        end = min(segment.end_offset, self.max_offset * UNIT_BYTES, position + max_units * UNIT_BYTES)
        relative = position - segment.start_offset
        return segment.view[relative:relative + max(end - position, 0)]

    def unit_at(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(commit_log_offset, size, tags_code) of one written unit, or None."""
        if not 0 <= queue_offset < self.max_offset:
            return None
        units = self.read_units(queue_offset, 1)
        if units is None or len(units) < UNIT_BYTES:
            return None
        commit_log_offset, size, tags_code = CQ_UNIT.unpack(units)
        return commit_log_offset, size, tags_code

    def next_file_start(self, queue_offset: int) -> int:
        """First queue offset of the file after the one that would hold `queue_offset`."""
        return queue_offset - queue_offset % self.units_per_segment + self.units_per_segment

    def truncate_from_commit_log_offset(self, commit_log_offset: int) -> None:
        """Drop the tail units whose commit_log_offset is >= `commit_log_offset` (and unwritten
        holes among them), zeroing their bytes (RocketMQ `truncateDirtyLogicFiles`)."""
        new_max = self.max_offset
        while new_max > self.min_offset:
            unit = self.unit_at(new_max - 1)
            if unit is not None and unit[1] != 0 and unit[0] < commit_log_offset:
                break
            new_max -= 1
        if new_max == self.max_offset:
            return
        log.info("consume queue %s:%d: truncated from queue offset %d to %d",
                 self.topic, self.queue_id, self.max_offset, new_max)
        self._segments.truncate(new_max * UNIT_BYTES, written_end=self.max_offset * UNIT_BYTES)
        self.allocated_units = 0              # later files are gone: reserve again
        self.max_offset = new_max
        self.min_offset = min(self.min_offset, new_max)
        self._flushed_bytes = min(self._flushed_bytes, new_max * UNIT_BYTES)
        self._set_max_commit_log_end()

    def correct_min_offset(self, commit_log_min_offset: int) -> None:
        """Move `min_offset` past units whose message lies before the commit log's first segment
        (RocketMQ `correctMinOffset`), by binary search."""
        low, high = self.min_offset, self.max_offset
        while low < high:
            middle = (low + high) // 2
            unit = self.unit_at(middle)
            if unit is not None and unit[0] < commit_log_min_offset:
                low = middle + 1
            else:
                high = middle
        self.min_offset = low

    def delete_files_below(self, commit_log_min_offset: int) -> int:
        """Delete leading files (never the last) whose every unit points below
        `commit_log_min_offset` and that hold no unflushed unit, then move `min_offset` to the
        first unit still pointing into the commit log (RocketMQ `deleteExpiredFile` +
        `correctMinOffset`). Returns how many files went."""
        segments = self._segments
        deleted = 0
        while len(segments.segments) > 1:
            first = segments.segments[0]
            last_unit = self.unit_at(first.end_offset // UNIT_BYTES - 1)
            if last_unit is None or last_unit[0] >= commit_log_min_offset or first.end_offset > self._flushed_bytes:
                break
            if not segments.delete_first():
                break
            deleted += 1
        self.min_offset = max(self.min_offset, segments.min_offset // UNIT_BYTES)
        self.correct_min_offset(commit_log_min_offset)
        return deleted

    def dirty_range(self) -> tuple[int, list[Path]]:
        """(written end in bytes, files holding unflushed units); pass the end to `mark_flushed`."""
        end = self.max_offset * UNIT_BYTES
        if end <= self._flushed_bytes:
            return end, []
        return end, self._segments.paths_between(self._flushed_bytes, end)

    def mark_flushed(self, end_bytes: int) -> None:
        self._flushed_bytes = max(self._flushed_bytes, min(end_bytes, self.max_offset * UNIT_BYTES))

    def close(self) -> None:
        self._segments.close()


def _written_bytes(segment: Segment) -> int:
    """Bytes of `segment` up to the end of its last written unit. Units are written in order, so a
    binary search on "size != 0" finds the end; bytes after it are examined only where the file
    system reports data (SEEK_DATA), i.e. never for a cleanly written file, and fully otherwise
    (a crash can leave later units without earlier ones). Read through the file, not the map: on
    tmpfs a read fault into a hole allocates a page, a SIGBUS when it is full (every restart on a
    full tmpfs died in this search)."""
    fd = os.open(segment.path, os.O_RDONLY)
    try:
        low, high = 0, segment.size // UNIT_BYTES
        while low < high:
            middle = (low + high) // 2
            if any(os.pread(fd, 4, middle * UNIT_BYTES + 8)):
                low = middle + 1
            else:
                high = middle
        end = low * UNIT_BYTES
        if end < segment.size and _may_have_data_after(fd, segment.size, end):
            # the last non-zero byte lies in the last written unit (its size field is non-zero)
            written = end + len(os.pread(fd, segment.size - end, end).rstrip(b"\0"))
            end = (written + UNIT_BYTES - 1) // UNIT_BYTES * UNIT_BYTES
        return end
    finally:
        os.close(fd)


def _may_have_data_after(fd: int, size: int, position: int) -> bool:
    try:
        block = os.fstat(fd).st_blksize or 4096
        next_block = -(-position // block) * block
        if any(os.pread(fd, min(next_block, size) - position, position)):
            return True
        if next_block >= size:
            return False
        os.lseek(fd, next_block, os.SEEK_DATA)
        return True
    except OSError as exc:
        return exc.errno != errno.ENXIO           # ENXIO: no data after next_block


class ConsumeQueueTable:
    """Every consume queue of a store, keyed (topic, queue_id). Reads use `get` (never creating
    anything); dispatch uses `get_or_create`."""

    def __init__(self, root: Path, units_per_segment: int) -> None:
        self.root, self.units_per_segment = root, units_per_segment
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}

    def load(self) -> None:
        """Load every `<root>/<topic>/<queue_id>/` directory; unexpected names are skipped."""
        if not self.root.is_dir():
            return
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir() or not is_valid_topic_name(topic_dir.name):
                log.warning("ignoring unexpected consume queue path %s", topic_dir)
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if not queue_dir.is_dir() or not queue_dir.name.isdigit():
                    log.warning("ignoring unexpected consume queue path %s", queue_dir)
                    continue
                queue = ConsumeQueue(self.root, topic_dir.name, int(queue_dir.name), self.units_per_segment)
                queue.load()
                self.queues[(queue.topic, queue.queue_id)] = queue

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created empty (no file until its first append) if absent; `ValueError` for a
        topic name that fails `is_valid_topic_name`."""
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            queue = self.queues[(topic, queue_id)] = ConsumeQueue(
                self.root, topic, queue_id, self.units_per_segment)
        return queue

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()
        self.queues.clear()
