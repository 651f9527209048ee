"""`<store>/checkpoint`: how far the store is known durable (RocketMQ `StoreCheckpoint`, which keeps
three timestamps; we keep offsets, which recovery can use directly).

Layout: `b"RQCP"`, u32be crc32(body), body = msgpack
`[commit_log_flushed_offset, reput_offset, written_at_ms, [[topic, queue_id, max_offset], ...]]`.
`reput_offset`: every commit-log record before it has its consume-queue unit flushed, and the
queue maxima are those units' queues' `max_offset` at that moment. Written to a temporary file,
fsynced, renamed over the old one and the directory fsynced, so a reader sees the old or the new
checkpoint, never a torn one. Blocking: callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from protocol.atomic import write_bytes_atomic

log = logging.getLogger(__name__)

_MAGIC = b"RQCP"
_HEADER = struct.Struct(">4sI")


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    commit_log_flushed_offset: int
    reput_offset: int
    written_at_ms: int
    queue_max_offsets: dict[tuple[str, int], int] = field(default_factory=dict)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Atomically replace `path` with `checkpoint` (blocking, fsyncs twice)."""
    body = msgpack.packb([
        checkpoint.commit_log_flushed_offset, checkpoint.reput_offset, checkpoint.written_at_ms,
        [[topic, queue_id, max_offset] for (topic, queue_id), max_offset
         in checkpoint.queue_max_offsets.items()],
    ], use_bin_type=True)
    write_bytes_atomic(path, _HEADER.pack(_MAGIC, zlib.crc32(body)) + body)


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint at `path`; None (logged) when it is missing or damaged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        magic, crc = _HEADER.unpack_from(data)
        body = data[_HEADER.size:]
        if magic != _MAGIC or zlib.crc32(body) != crc:
            raise ValueError("bad magic or CRC")
        flushed, reput, written_at_ms, queues = msgpack.unpackb(body, raw=False)
        return Checkpoint(
            commit_log_flushed_offset=int(flushed), reput_offset=int(reput), written_at_ms=int(written_at_ms),
            queue_max_offsets={(str(topic), int(queue_id)): int(max_offset)
                               for topic, queue_id, max_offset in queues})
    except (ValueError, TypeError, struct.error, msgpack.UnpackException) as exc:
        log.warning("ignoring damaged checkpoint %s: %s", path, exc)
        return None
