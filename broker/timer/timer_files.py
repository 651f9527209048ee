"""`TimerLog` (append-only records) and `TimerWheel` (a fixed-size, memory-mapped slot array,
read and written only in pages allocated on disk): the files of the timer store under
`<store>/timer/timerlog` and `<store>/timer/timerwheel` (RocketMQ 5 `TimerLog`, `TimerWheel`).
Synchronous; layout and arithmetic in `broker.timer.layout`.

Both survive a kill -9 as they are: records go to the file with `os.write` (the kernel has them
once the call returns) and slots into a shared mapping; `flush()` makes them durable against a
power loss too (`TimerCheckpointService` calls it before each checkpoint)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

from broker.timer.layout import (
    EMPTY_SLOT,
    RECORD_SIZE,
    SLOT_SIZE,
    Slot,
    TimerRecord,
    decode_record,
    decode_slot,
    encode_slot,
    slot_index,
)

log = logging.getLogger(__name__)
PAGE_BYTES = mmap.PAGESIZE
READ_BLOCK_BYTES = 64 * 1024     # records are read a block at a time: chains mostly run backwards
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_fallocate = getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


class TimerLog:
    """Append-only 32-byte records; positions are byte offsets from the file's start. On open a
    torn tail (a partial record) is cut off. Raises `OSError` from the file system."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(self._fd).st_size
        self.size = size - size % RECORD_SIZE
        if self.size != size:
            os.ftruncate(self._fd, self.size)
        self._block_start, self._block = 0, b""
        self.dropped_to = 0             # the prefix given back to the file system (this run)

    def drop_before(self, pos: int) -> int:
        """Give the disk blocks of the whole pages below `pos` back to the file system (a hole
        punched with `fallocate(PUNCH_HOLE | KEEP_SIZE)`: positions do not move, the records there
        read as invalid). For a prefix no chain reaches any more (`TimerState.truncate`). Returns
        the bytes newly dropped; 0 where the file system cannot punch holes (logged once). Raises
        nothing: a failed punch only keeps the space."""
        end = min(pos, self.size) // PAGE_BYTES * PAGE_BYTES
        if end <= self.dropped_to or _fallocate is None:
            return 0
        start = self.dropped_to
        if _fallocate(self._fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, start, end - start) != 0:
            err = ctypes.get_errno()
            if err in (errno.EOPNOTSUPP, errno.ENOSYS):
                log.warning("timer: this file system cannot punch holes; the timer log keeps its delivered prefix")
                self.dropped_to = 1 << 62       # never again this run
            else:
                log.warning("timer: dropping the timer log below %d failed: %s", end, os.strerror(err))
            return 0
        self.dropped_to = end
        if self._block_start < end:
            self.forget_reads()
        return end - start

    def append(self, records: bytes) -> int:
        """Append whole records (a multiple of 32 bytes); returns the position of the first.
        Raises `OSError` (ENOSPC, EIO) with the log cut back to what it was: nothing appended."""
        pos = self.size
        view = memoryview(records)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            os.ftruncate(self._fd, pos)
            raise
        self.size += len(records)
        return pos

    def read(self, pos: int) -> TimerRecord | None:
        """The record at `pos`; None when it is outside the log or fails its check."""
        if pos < 0 or pos + RECORD_SIZE > self.size:
            return None
        start = self._block_start
        if not start <= pos <= start + len(self._block) - RECORD_SIZE:
            start = max(0, pos + RECORD_SIZE - READ_BLOCK_BYTES)
            self._block_start, self._block = start, os.pread(self._fd, pos + RECORD_SIZE - start, start)
            if len(self._block) < pos + RECORD_SIZE - start:
                return None
        return decode_record(self._block, pos - start, pos)

    def forget_reads(self) -> None:
        """Drop the read block (records appended since may lie within its range)."""
        self._block_start, self._block = 0, b""

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


class TimerWheel:
    """`total` slots of 32 bytes in a file mapped shared (a sparse file: only the pages of slots
    in use take memory or disk). Raises `ValueError` when an existing wheel has another size (the
    precision or `timer_max_delay_sec` changed: RocketMQ refuses to start then too)."""

    def __init__(self, path: Path, total: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.total = total
        length = self._length = total * SLOT_SIZE
        fd = self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._backed = bytearray(-(-length // PAGE_BYTES))     # pages whose disk blocks are allocated
        try:
            size = os.fstat(fd).st_size
            if size not in (0, length):
                raise ValueError(f"timer wheel {path} has {size // SLOT_SIZE} slots, the config needs {total}: "
                                 f"timer_precision_ms or timer_max_delay_sec changed; move the file away to start "
                                 f"over (timer messages not yet delivered are then lost)")
            if size == 0:
                os.ftruncate(fd, length)
            self._map = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._find_backed_pages(fd, length)
        except BaseException:
            os.close(fd)
            raise

    def _find_backed_pages(self, fd: int, length: int) -> None:
        """Mark the pages that hold data (SEEK_DATA / SEEK_HOLE): the others are holes, read as
        empty without touching the mapping (on tmpfs even a read fault of a hole allocates a page,
        a SIGBUS on a full disk)."""
        backed, position = self._backed, 0
        while position < length:
            try:
                data = os.lseek(fd, position, os.SEEK_DATA)
            except OSError:         # ENXIO: no data after `position`
                return
            hole = min(os.lseek(fd, data, os.SEEK_HOLE), length)
            for page in range(data // PAGE_BYTES, -(-hole // PAGE_BYTES)):
                backed[page] = 1
            position = hole

    def get(self, slot: int) -> Slot:
        offset = slot_index(slot, self.total) * SLOT_SIZE
        if not self._backed[offset // PAGE_BYTES]:
            return EMPTY_SLOT
        return decode_slot(self._map, offset, slot)

    def reserve(self, slots: Iterable[int]) -> None:
        """Allocate the disk blocks of the pages holding `slots` before they are written: a write
        into a hole of the mapped sparse file on a full disk would be a SIGBUS, this is an `OSError`
        (ENOSPC) with nothing written. A page is allocated once (`posix_fallocate`)."""
        backed = self._backed
        for slot in slots:
            page = slot_index(slot, self.total) * SLOT_SIZE // PAGE_BYTES
            if not backed[page]:
                start = page * PAGE_BYTES       # (never past the end: the file keeps its size)
                os.posix_fallocate(self._fd, start, min(PAGE_BYTES, self._length - start))
                backed[page] = 1

    def put(self, slot: int, value: Slot) -> None:
        """Write `slot` (its page `reserve`d first)."""
        offset = slot_index(slot, self.total) * SLOT_SIZE
        self._map[offset:offset + SLOT_SIZE] = encode_slot(slot, value)

    def flush(self) -> None:
        self._map.flush()

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
