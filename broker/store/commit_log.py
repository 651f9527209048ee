"""The commit log: every message of every topic, appended as records (`record.py`) to fixed-size
mapped segments in `<store>/commitlog/` (RocketMQ `CommitLog`). Synchronous.

Every file is allocated whole before a byte is written through its map (created preallocated; a file
loaded at start gets its blocks, a no-op for one made here, before its first write): a full disk
is then an `OSError` from an append, never a SIGBUS.

A record never spans segments: when it does not fit in the rest of the current segment, the rest
stays zeros (RocketMQ writes a BLANK record there) and the record goes to the start of the next one.
So a reader that meets `total_size == 0` jumps to the next segment's start when one exists; in the
last segment it is the end of data. A record's `commit_log_offset` is its global byte position.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

from broker.store.record import (
    HEADER_BYTES,
    RECORD_HEADER,
    EncodedRun,
    RecordError,
    RunHead,
    RunMessage,
    StoredEntry,
    decode_stored_fields,
    encode_run,
    payload_commit_log_offset,
    read_stored,
    record_size_at,
    write_record,
)
from broker.store.segment import MappedSegments, Segment
from protocol.message import F_COMMIT_LOG_OFFSET

log = logging.getLogger(__name__)

READ_BACK_ENTRIES = 256         # records decoded per `read_stored` call by `read_back`

PayloadEncoder = Callable[[int, int], bytes]
"""`encode(index, commit_log_offset) -> payload` for message `index` of a batch stored at that offset."""
RunEncoder = Callable[[int, int, int], EncodedRun]
"""`encode(start, commit_log_offset, limit)`: the records of messages start.. from that offset that
end by `limit` (`record.encode_run`)."""


class CommitLog:
    """`max_offset` is the write position: the end of the last record (0 for an empty log).
    `append_batch` writes; `read_payload` is the unchecked hot-path read used with consume-queue
    units; `payload_at` is the checked read for offsets that come from outside."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self._segments = MappedSegments(directory, segment_bytes, preallocate=True)
        self._segment_bytes = segment_bytes
        self.max_offset = 0

    def load(self) -> None:
        """Map the existing segment files. Call `recover` next to find `max_offset`.

        A log keeps the file size it was created with: when every existing file has another size
        than `segment_bytes` (a store made before the default went from 1 GiB to 32 MiB, or with
        another `commit_log_segment_bytes`), that size is used for the whole log, with a warning,
        so an upgrade or a changed setting never leaves a store unreadable; the setting applies to
        new stores. Files of different sizes raise `ValueError` (from `MappedSegments.load`)."""
        found = self._segments.existing_segment_bytes()
        if found is not None and found != self._segment_bytes:
            log.warning("commit log %s was created with files of %d bytes: keeping that size "
                        "(commit_log_segment_bytes = %d applies to new stores)",
                        self._segments.directory, found, self._segment_bytes)
            self._segments = MappedSegments(self._segments.directory, found, preallocate=True)
            self._segment_bytes = found
        self._segments.load()

    @property
    def segment_bytes(self) -> int:
        """The size of every commit-log file."""
        return self._segment_bytes

    @property
    def min_offset(self) -> int:
        """Start of the first segment (0 when empty)."""
        return self._segments.min_offset

    @property
    def segment_starts(self) -> list[int]:
        return [s.start_offset for s in self._segments.segments]

    def recover(self, from_offset: int, *, deep: bool) -> int:
        """Find the end of valid data walking records from `from_offset` (a record boundary, e.g. the
        checkpoint's flushed offset; clamped into the mapped range, or the last segment's start when
        it falls outside), truncate everything after it, set and return `max_offset`.

        Every walk checks size bounds and CRC (RocketMQ `checkMessageAndReturnSize` with
        `checkCRCOnRecover`). `deep` (after a crash) also decodes each payload and requires its
        commit_log_offset field to equal its position, and a segment's zero tail to be all zeros
        before jumping to the next segment; the torn tail is then always zeroed."""
        segments = self._segments
        last = segments.last
        if last is None:
            self.max_offset = 0
            return 0
        position = max(from_offset, segments.min_offset)
        if position > last.end_offset or (segments.find(position) is None and position != last.end_offset):
            position = last.start_offset
        found_invalid = False
        while True:
            segment = segments.find(position)
            if segment is None:
                break
            relative = position - segment.start_offset
            size = record_size_at(segment.mm, relative, segment.size)
            if size > 0:
                if deep and not _payload_matches(segment, relative, size, position):
                    found_invalid = True
                    break
                position += size
                continue
            if size == 0 and segments.find(segment.end_offset) is not None:
                if deep and not _all_zero(segment, relative):
                    found_invalid = True
                    break
                position = segment.end_offset
                continue
            found_invalid = size < 0
            break
        if found_invalid or deep:
            log.warning("commit log: truncating at %d (%s)", position,
                        "invalid record" if found_invalid else "after a crash")
            segments.truncate(position)
        else:
            segments.truncate(position, zero=False)
        self.max_offset = position
        return position

    def truncate_tail(self, offset: int) -> None:
        """Drop every byte at or after `offset` (a record boundary at or before `max_offset`): the
        rest of its segment is zeroed, later segments deleted. Run on a loaded, stopped log."""
        self._segments.truncate(offset)
        self.max_offset = min(self.max_offset, offset)

    def append_batch(self, count: int, encode: PayloadEncoder) -> tuple[list[int], list[int]] | None:
        """Append `count` records whose payloads `encode(index, commit_log_offset)` produces, one
        after another (rolling to a new segment as needed). Returns (commit_log_offsets, sizes) with
        sizes the record total sizes, or None (nothing written) when a record is larger than a whole
        segment. `encode` may be called twice for the record that rolls, with the new offset.
        Raises `OSError` (nothing of the batch written) when a new segment cannot be created, or
        the current one given its blocks, e.g. ENOSPC from the preallocation."""
        segment_bytes = self._segment_bytes
        batch_start = position = self.max_offset
        segment = self._segments.get_or_create(position - position % segment_bytes)
        segment.allocate_through(segment_bytes)        # raises before anything is written
        segment_end = segment.start_offset + segment_bytes
        chunk_start = position
        chunks: list[bytes] = []
        offsets: list[int] = []
        sizes: list[int] = []
        header, crc32 = RECORD_HEADER.pack, zlib.crc32
        for index in range(count):
            payload = encode(index, position)
            total = len(payload) + HEADER_BYTES
            if position + total > segment_end:
                _write(segment, chunk_start, chunks)
                position = chunk_start = segment_end
                chunks = []
                payload = encode(index, position)
                total = len(payload) + HEADER_BYTES
                if total > segment_bytes:
                    self._rollback(batch_start, position)
                    return None
                try:
                    segment = self._segments.get_or_create(position)
                except OSError:                   # ENOSPC, EIO: the batch is not stored at all
                    self._rollback(batch_start, position)
                    raise
                segment_end = position + segment_bytes
            chunks.append(header(total, crc32(payload)))
            chunks.append(payload)
            offsets.append(position)
            sizes.append(total)
            position += total
        _write(segment, chunk_start, chunks)
        self.max_offset = position
        return offsets, sizes

    def append_run(self, count: int, encode: RunEncoder) -> tuple[list[int], list[int]] | None:
        """`append_batch` of `count` records that `encode(start, commit_log_offset, limit)` encodes
        in runs (records start.. from that offset, as many as end by `limit`, the end of the current
        file; see `record.encode_run`): each run is written into its file in one go, and the log
        rolls to the next file when a record does not fit. Same results, errors and rollback as
        `append_batch`."""
        segment_bytes = self._segment_bytes
        batch_start = position = self.max_offset
        segment = self._segments.get_or_create(position - position % segment_bytes)
        segment.allocate_through(segment_bytes)        # raises before anything is written
        offsets: list[int] = []
        sizes: list[int] = []
        while len(offsets) < count:
            data, run_offsets, run_sizes = encode(len(offsets), position, segment.start_offset + segment_bytes)
            if run_offsets:
                relative = position - segment.start_offset
                segment.view[relative:relative + len(data)] = data
                offsets += run_offsets
                sizes += run_sizes
                position += len(data)
                continue
            if position == segment.start_offset:      # larger than a whole file
                self._rollback(batch_start, position)
                return None
            position = segment.start_offset + segment_bytes
            try:
                segment = self._segments.get_or_create(position)
            except OSError:                   # ENOSPC, EIO: the batch is not stored at all
                self._rollback(batch_start, position)
                raise
        self.max_offset = position
        return offsets, sizes

    def append_one(self, encode: Callable[[int], bytes]) -> tuple[int, int] | None:
        """Append one record whose payload `encode(commit_log_offset)` produces; returns
        (commit_log_offset, total_size), or None when it is larger than a whole segment. The one-
        message send path: the header and payload go straight into the map, with none of
        `append_batch`'s lists; a record that does not fit in the current segment takes
        `append_batch` (which rolls). Raises `OSError` as `append_batch` does."""
        position = self.max_offset
        segment_bytes = self._segment_bytes
        relative = position % segment_bytes
        segment = self._segments.find(position) if relative else None
        if segment is not None and segment.allocated == segment_bytes:
            payload = encode(position)
            total = len(payload) + HEADER_BYTES
            if relative + total <= segment_bytes:
                RECORD_HEADER.pack_into(segment.mm, relative, total, zlib.crc32(payload))
                segment.view[relative + HEADER_BYTES:relative + total] = payload
                self.max_offset = position + total
                return position, total
        written = self.append_batch(1, lambda _, commit_log_offset: encode(commit_log_offset))
        return None if written is None else (written[0][0], written[1][0])

    def append_record(self, head: RunHead, queue_offset: int, message: RunMessage) -> tuple[int, int] | None:
        """`append_one` of the record of `message` (properties, flag, body) with `head` (see
        `record.RunHead`) at queue offset `queue_offset`: (commit_log_offset, total_size), or None
        when it is larger than a whole segment; raises `OSError` as `append_batch` does. The one-
        message send path: encoded and written into the map by one C call (`record.write_record`)
        when it fits in the current, allocated segment; else `append_run` (which rolls)."""
        position = self.max_offset
        segment_bytes = self._segment_bytes
        relative = position % segment_bytes
        segment = self._segments.find(position) if relative else None
        if segment is not None and segment.allocated == segment_bytes:
            total = write_record(segment.mm, relative, segment_bytes, head, queue_offset, position, message)
            if total:
                self.max_offset = position + total
                return position, total
        written = self.append_run(1, lambda start, commit_log_offset, limit: encode_run(
            head, [message], start, queue_offset, commit_log_offset, limit))
        return None if written is None else (written[0][0], written[1][0])

    def append_replicated(self, commit_log_offset: int, data: bytes | memoryview) -> None:
        """Write a master's commit-log bytes at the same offset (a slave; RocketMQ
        `CommitLog#appendData`): `commit_log_offset` is `max_offset`, or the start of a later file
        when the master rolled past a zero tail. `data` lies in one file and ends on a record
        boundary. Raises `ValueError` (nothing written) otherwise, `OSError` when a file cannot be
        created or given its blocks."""
        segment_bytes = self._segment_bytes
        relative = commit_log_offset % segment_bytes
        if commit_log_offset < self.max_offset or (commit_log_offset > self.max_offset and relative):
            raise ValueError(f"replicated bytes at {commit_log_offset} do not follow the log's end {self.max_offset}")
        if relative + len(data) > segment_bytes:
            raise ValueError(f"replicated bytes at {commit_log_offset} ({len(data)} bytes) span two files")
        segment = self._segments.get_or_create(commit_log_offset - relative)
        segment.allocate_through(segment_bytes)
        segment.view[relative:relative + len(data)] = data
        self.max_offset = commit_log_offset + len(data)

    def replication_chunk(self, from_offset: int, max_bytes: int) -> tuple[int, memoryview] | None:
        """The bytes a master sends a slave next: (commit_log_offset, view) of whole records from
        `from_offset` (a record boundary; raised to `min_offset` when retention removed it, moved to
        the next file from a zero tail), within one file, at most `max_bytes` unless the first
        record alone is larger. None when there is nothing after `from_offset` yet."""
        end = self.max_offset
        position = max(from_offset, self.min_offset)
        while position < end:
            segment = self._segments.find(position)
            if segment is None:
                return None
            start = relative = position - segment.start_offset
            limit = min(segment.size, end - segment.start_offset)
            if limit == end - segment.start_offset and limit - start <= max_bytes and limit > start:
                return position, segment.view[start:limit]     # up to the log's end: whole records, no walk
            unpack = RECORD_HEADER.unpack_from      # the master's own records: sizes only, no CRC here
            while relative + HEADER_BYTES <= limit:
                total = unpack(segment.mm, relative)[0]
                too_much = relative > start and relative + total - start > max_bytes
                if total == 0 or relative + total > limit or too_much:
                    break
                relative += total
            if relative > start:
                return position, segment.view[start:relative]
            position = segment.end_offset          # a zero tail: the master rolled to the next file
        return None

    def _rollback(self, batch_start: int, written_end: int) -> None:
        """Undo a partly written batch: zero [batch_start, written_end) and drop segments after it."""
        holder = self._segments.find(batch_start)
        if holder is not None:
            end = min(holder.end_offset, written_end)
            start = batch_start - holder.start_offset
            holder.view[start:end - holder.start_offset] = bytes(end - batch_start)
        self._segments.truncate(batch_start, zero=False)

    def read_payload(self, commit_log_offset: int, size: int) -> memoryview | None:
        """Payload of the record at `commit_log_offset` whose total size is `size` (both from a
        consume-queue unit, so not re-checked); None when its segment no longer exists."""
        segment = self._segments.find(commit_log_offset)
        if segment is None:
            return None
        relative = commit_log_offset - segment.start_offset
        return segment.view[relative + HEADER_BYTES:relative + size]

    def payload_at(self, commit_log_offset: int) -> memoryview | None:
        """Payload of the record starting exactly at `commit_log_offset`, checked: inside the written
        range, sane size, CRC, and the payload's own commit_log_offset field equal to it. None
        otherwise (e.g. an offset into the middle of a record)."""
        payload = self.intact_payload_at(commit_log_offset)
        if payload is None:
            return None
        try:
            if payload_commit_log_offset(payload) != commit_log_offset:
                return None
        except RecordError:
            return None
        return payload

    def intact_payload_at(self, commit_log_offset: int) -> memoryview | None:
        """`payload_at` without the check of the payload's commit_log_offset field, for a caller
        that decodes the payload anyway and compares the field itself (a bare intact record at an
        offset into the middle of a message's body is not ruled out here)."""
        if not self.min_offset <= commit_log_offset < self.max_offset:
            return None
        segment = self._segments.find(commit_log_offset)
        if segment is None:
            return None
        relative = commit_log_offset - segment.start_offset
        limit = min(segment.size, self.max_offset - segment.start_offset)
        size = record_size_at(segment.mm, relative, limit)
        if size <= 0:
            return None
        return segment.view[relative + HEADER_BYTES:relative + size]

    def records(self, from_offset: int, to_offset: int) -> Iterator[tuple[int, int, memoryview]]:
        """(commit_log_offset, total_size, payload) of each record in [from_offset, to_offset), from
        a record boundary, jumping zero tails; stops early (with an error log) at a damaged record."""
        return cast(Iterator[tuple[int, int, memoryview]], self._walk(from_offset, to_offset, 0))

    def read_back(self, from_offset: int, to_offset: int) -> Iterator[list[StoredEntry] | tuple[int, int, memoryview]]:
        """The records `records` walks, the usual ones as lists of `StoredEntry` (`read_stored`: C
        when built, decoded with no Python per record); any other as `records` gives it."""
        return self._walk(from_offset, to_offset, READ_BACK_ENTRIES)

    def _walk(self, from_offset: int, to_offset: int,
              usual_count: int) -> Iterator[list[StoredEntry] | tuple[int, int, memoryview]]:
        position = from_offset
        while position < to_offset:
            segment = self._segments.find(position)
            if segment is None:
                log.error("commit log: no segment holds offset %d", position)
                return
            relative = position - segment.start_offset
            if usual_count:
                limit = max(relative, min(segment.size, to_offset - segment.start_offset))
                entries = read_stored(segment.mm, relative, limit, segment.start_offset, usual_count)
                if entries:
                    yield entries
                    position = entries[-1][0] + entries[-1][1]
                    continue
            size = record_size_at(segment.mm, relative, segment.size)
            if size == 0:
                position = segment.end_offset
                continue
            if size < 0:
                log.error("commit log: damaged record at %d", position)
                return
            yield position, size, segment.view[relative + HEADER_BYTES:relative + size]
            position += size

    def oldest_deletable(self, safe_end: int) -> Segment | None:
        """The first segment if retention may delete it: never the last (the one being written)
        and only when it lies wholly before `safe_end` (flushed and dispatched)."""
        segments = self._segments.segments
        if len(segments) < 2 or segments[0].end_offset > safe_end:
            return None
        return segments[0]

    def delete_oldest(self) -> bool:
        """Delete the first segment (after `oldest_deletable` chose it); False while a pull still
        holds a view of it. `min_offset` moves to the next segment's start."""
        return self._segments.delete_first()

    def next_segment_start(self, commit_log_offset: int) -> int:
        """Start of the segment after the one holding `commit_log_offset`."""
        return commit_log_offset - commit_log_offset % self._segment_bytes + self._segment_bytes

    def flush_paths(self, from_offset: int, to_offset: int) -> list[Path]:
        """Files an fsync of bytes [from_offset, to_offset) must cover."""
        return self._segments.paths_between(from_offset, to_offset)

    def close(self) -> None:
        self._segments.close()


def _write(segment: Segment, commit_log_offset: int, chunks: list[bytes]) -> None:
    if chunks:
        data = b"".join(chunks)
        relative = commit_log_offset - segment.start_offset
        segment.view[relative:relative + len(data)] = data


def _payload_matches(segment: Segment, relative: int, size: int, position: int) -> bool:
    try:
        fields = decode_stored_fields(segment.view[relative + HEADER_BYTES:relative + size])
    except RecordError:
        return False
    return bool(fields[F_COMMIT_LOG_OFFSET] == position)


def _all_zero(segment: Segment, relative: int) -> bool:
    return segment.view[relative:].tobytes().count(0) == segment.size - relative
