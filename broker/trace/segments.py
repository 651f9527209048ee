"""`TraceSegments`: the trace's append-only files under `<store>/trace/`, bounded by age and size.

Each segment is `<first write, epoch ms>.trace`: one msgpack array of records per write, back to
back (`recorder` names the records), each written whole, so a file ends at a write's boundary (a
torn tail after a crash is ignored).
Sealed segments (full, or not the newest) have a `.sum` beside them: per (topic, queue_id), the
lowest and highest queue offset their queue records cover, so a query decodes only the segments
that can say something about a queue offset. Retention deletes whole segments, oldest first: those
last written more than `retention_ms` ago, then as many as needed to keep the files within
`max_bytes` (the newest one is never deleted for size; it is sealed at `segment_bytes`, which is
capped at a quarter of `max_bytes` so the bound holds).

Lookups (`find_message_records`, `find_queue_records`) run in a worker thread over a `snapshot`
(paths, sizes and summaries copied on the event loop), never over the live object."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from protocol.message import PROPERTY_DLQ_RESENT_FROM, PROPERTY_KEYS, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_UNIQ_KEY
from protocol.trace import (
    CLIENT,
    COMMITTED,
    COMMITTED_RUN,
    HALF_BATCH,
    MESSAGE_KINDS,
    OTHER_KINDS,
    POPPED,
    PULLED,
    PULLED_SET,
    SENT_BATCH,
    SENT_BATCH_SET,
    SENT_SET,
    as_properties,
)

log = logging.getLogger(__name__)

Summary = dict[tuple[str, int], list[int]]      # (topic, queue_id) -> [lowest, highest] queue offset
MAX_CLIENTS = 100_000                           # client ids (by connection) a segment keeps in memory
MAX_DECODED_BYTES = 256 << 20                   # trace bytes one lookup decodes at most
_SUFFIX, _SUMMARY = ".trace", ".sum"
_RUNS = {PULLED_SET: 4, SENT_BATCH_SET: 3}      # set records of runs: items per run ([from, next) first)


@dataclass(slots=True)
class Segment:
    path: Path
    size: int
    last_ms: int                  # newest write (epoch ms)
    summary: Summary
    sealed: bool
    clients: dict[str, str]       # "ip:port" -> client id, from its CLIENT records


@dataclass(frozen=True, slots=True)
class SegmentView:
    """What a lookup thread reads of a segment: its first `size` bytes and its summary."""

    path: Path
    size: int
    summary: Summary


def _covered(record: Sequence[Any]) -> tuple[str, int, int, int] | None:
    """(topic, queue_id, lowest, highest) queue offsets a queue record covers; None for others."""
    kind = record[0]
    if kind in OTHER_KINDS:
        return None
    topic, queue_id = record[2], record[3]
    if kind in (PULLED, SENT_BATCH, HALF_BATCH):        # [from, next)
        return (topic, queue_id, record[4], record[5] - 1) if record[5] > record[4] else None
    if kind in (POPPED, SENT_SET, COMMITTED_RUN):
        return (topic, queue_id, min(record[4]), max(record[4])) if record[4] else None
    stride = _RUNS.get(kind)
    if stride is not None:      # [from, next, ...] a run of offsets, each with some: next > from
        runs = record[4]
        return (topic, queue_id, min(runs[0::stride]), max(runs[1::stride]) - 1) if len(runs) >= stride else None
    if kind == COMMITTED:   # old -> new: passes the offsets old..new-1 (the first commit: 0..new-1)
        old, new = record[4], record[5]
        low = 0 if old is None else min(old, new)
        return topic, queue_id, low, max(low, max(old or 0, new) - 1)
    return topic, queue_id, record[4], record[4]


def _summarize(summary: Summary, clients: dict[str, str], records: Sequence[Sequence[Any]]) -> None:
    """Add what `records` cover to `summary`, and their CLIENT records to `clients` (at most
    `MAX_CLIENTS` per segment: a flood of connections costs no unbounded memory)."""
    for record in records:
        kind = record[0]
        if kind in OTHER_KINDS:
            if kind == CLIENT and len(clients) < MAX_CLIENTS and len(record) >= 4:
                clients[str(record[2])] = str(record[3])
            continue
        covered = _covered(record)
        if covered is None:
            continue
        topic, queue_id, low, high = covered
        span = summary.get((topic, queue_id))
        if span is None:
            summary[(topic, queue_id)] = [low, high]
        else:
            if low < span[0]:
                span[0] = low
            if high > span[1]:
                span[1] = high


def read_records(path: Path, size: int) -> Iterator[list[Any]]:
    """The records in the first `size` bytes of `path` (a torn or corrupt tail ends the reading;
    anything but an array of records at least 2 long is skipped)."""
    try:
        with open(path, "rb") as file:
            data = file.read(size)
    except FileNotFoundError:       # deleted by retention meanwhile
        return
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    try:
        for batch in unpacker:
            if isinstance(batch, list):
                yield from (r for r in batch if isinstance(r, list) and len(r) >= 2)
    except (ValueError, msgpack.UnpackException) as exc:
        log.warning("trace segment %s: unreadable from a record on (%s); the rest is skipped", path, exc)


class TraceSegments:
    """One writer at a time (`load`, `append`, `enforce_retention`, `close`: the trace service runs
    them in a worker thread, so a slow disk never holds up the event loop); `snapshot`,
    `client_ids`, `total_bytes` and `segment_count` may be called meanwhile from another thread
    (the loop): the segments' list and figures are guarded by a lock never held across I/O."""

    def __init__(self, directory: Path, *, segment_bytes: int, max_bytes: int, retention_ms: int,
                 now_ms: Callable[[], int]) -> None:
        self.directory = directory
        self._segment_bytes = max(1024, min(segment_bytes, max_bytes // 4))
        self._max_bytes, self._retention_ms, self._now_ms = max_bytes, retention_ms, now_ms
        self._segments: list[Segment] = []
        self._file: Any = None          # the newest segment's file, open for appending
        self._packer = msgpack.Packer(use_bin_type=True)
        self._lock = threading.Lock()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        with self._lock:
            return len(self._segments)

    def load(self) -> None:
        """Find the segments of an earlier run (rebuilding a missing summary by reading the file)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.glob("*" + _SUFFIX)):
            size = path.stat().st_size
            summary: Summary | None = None
            clients: dict[str, str] = {}
            summary_path = path.with_suffix(_SUMMARY)
            if summary_path.exists():
                with contextlib.suppress(ValueError, OSError, TypeError, KeyError, msgpack.UnpackException):
                    saved = msgpack.unpackb(summary_path.read_bytes())
                    summary = {(t, q): [lo, hi] for t, q, lo, hi in saved["queues"]}
                    clients = dict(saved["clients"])
            if summary is None:
                summary, clients = {}, {}
                _summarize(summary, clients, list(read_records(path, size)))
            with self._lock:
                self._segments.append(Segment(path, size, int(path.stat().st_mtime * 1000), summary, True, clients))

    def append(self, records: Sequence[Sequence[Any]]) -> None:
        """Write `records` (one array) at the end of the newest segment (a new one when it is
        sealed or full). Raises `OSError` when the file cannot be written."""
        if not records:
            return
        data = self._packer.pack(records)
        segment = self._segments[-1] if self._segments else None
        if segment is None or segment.sealed or self._file is None:
            segment = self._open_new()
        self._file.write(data)
        self._file.flush()
        with self._lock:
            segment.size += len(data)
            segment.last_ms = self._now_ms()
            _summarize(segment.summary, segment.clients, records)
        if segment.size >= self._segment_bytes:
            self._seal(segment)
            self.enforce_retention()            # the size bound holds at every new segment

    def _open_new(self) -> Segment:
        if self._segments and not self._segments[-1].sealed:
            self._seal(self._segments[-1])
        now_ms = self._now_ms()
        if self._segments:
            now_ms = max(now_ms, int(self._segments[-1].path.stem) + 1)
        path = self.directory / f"{now_ms:013d}{_SUFFIX}"
        self._file = open(path, "ab")       # noqa: SIM115 (kept open until sealed)
        segment = Segment(path, 0, now_ms, {}, False, {})
        with self._lock:
            self._segments.append(segment)
        return segment

    def _seal(self, segment: Segment) -> None:
        """Close the segment's file and write its summary. Raises `OSError` on a full disk, with the
        segment sealed all the same (a missing summary is rebuilt by `load`)."""
        file, self._file = self._file, None
        segment.sealed = True
        if file is not None:
            file.close()
        with self._lock:
            rows = [[t, q, lo, hi] for (t, q), (lo, hi) in segment.summary.items()]
            clients = dict(segment.clients)
        tmp = segment.path.with_suffix(_SUMMARY + ".tmp")
        tmp.write_bytes(msgpack.packb({"queues": rows, "clients": clients}))
        os.replace(tmp, segment.path.with_suffix(_SUMMARY))

    def retention_due(self) -> bool:
        """Whether `enforce_retention` would delete a segment now (a cheap test: the oldest one's
        time and the total size)."""
        if not self._segments:
            return False
        return (self._segments[0].last_ms < self._now_ms() - self._retention_ms
                or (self.total_bytes > self._max_bytes and len(self._segments) > 1))

    def enforce_retention(self) -> int:
        """Delete segments past `retention_ms`, then the oldest while over `max_bytes`; returns how
        many were deleted."""
        deleted = 0
        while self.retention_due():
            oldest = self._segments[0]
            if not oldest.sealed:
                self._seal(oldest)
            with self._lock:
                self._segments.pop(0)
            for path in (oldest.path, oldest.path.with_suffix(_SUMMARY)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            deleted += 1
        return deleted

    def close(self) -> None:
        """Seal the newest segment (its summary written) and close it."""
        if self._segments and not self._segments[-1].sealed:
            self._seal(self._segments[-1])

    def client_ids(self) -> dict[str, str]:
        """"ip:port" -> the client id its connection heartbeated with, over every segment (newest wins)."""
        merged: dict[str, str] = {}
        with self._lock:
            for segment in self._segments:
                merged.update(segment.clients)
        return merged

    def snapshot(self) -> list[SegmentView]:
        with self._lock:
            return [SegmentView(s.path, s.size, {k: list(v) for k, v in s.summary.items()}) for s in self._segments]


_STORED_AT = {"S": 7, "B": 10, "D": 9, "T": 7}     # where a message record has its copy's commit-log offset


def matches(properties: Any, wanted: str) -> bool:
    """Whether a message with `properties` is found by `wanted`: its UNIQ_KEY, a word of its KEYS,
    or (a copy: retry, DLQ, resend) the ORIGIN_MESSAGE_ID or DLQ_RESENT_FROM it carries."""
    if not isinstance(properties, dict):
        return False
    if wanted in (properties.get(PROPERTY_UNIQ_KEY), properties.get(PROPERTY_ORIGIN_MESSAGE_ID),
                  properties.get(PROPERTY_DLQ_RESENT_FROM)):
        return True
    keys = properties.get(PROPERTY_KEYS)
    return isinstance(keys, str) and wanted in keys.split()


def find_message_records(views: list[SegmentView], wanted: str, limit: int, commit_log_offset: int | None = None,
                         max_decoded_bytes: int = MAX_DECODED_BYTES) -> list[list[Any]]:
    """Message records (SENT, BACK, DLQ, HALF) of messages found by `wanted` (`matches`), or, with
    `commit_log_offset`, of the copy stored there; oldest first, at most `limit`. By `wanted`, a
    segment is decoded only when its bytes contain `wanted` as msgpack writes it. Segments are
    read newest first and no more than `max_decoded_bytes` of them decoded (a key as common as
    "a" costs a query a bounded time; what lies further back is not found)."""
    needle = msgpack.packb(wanted) if commit_log_offset is None else None
    found: list[list[Any]] = []
    budget = max_decoded_bytes
    for view in reversed(views):
        if view.size == 0 or (needle is not None and not _contains(view, needle)):
            continue
        budget -= view.size
        if budget < 0:
            break
        here = [record for record in read_records(view.path, view.size) if record[0] in MESSAGE_KINDS
                and (matches(as_properties(record[-1]), wanted) if commit_log_offset is None
                     else record[_STORED_AT[record[0]]] == commit_log_offset)]
        found = here + found
        if len(found) >= limit:
            return found[len(found) - limit:]
    return found


def _contains(view: SegmentView, needle: bytes) -> bool:
    try:
        with open(view.path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return mapped.find(needle, 0, view.size) >= 0
    except (FileNotFoundError, ValueError):     # deleted meanwhile; empty
        return False


def find_queue_records(views: list[SegmentView], wanted: dict[tuple[str, int], set[int]], limit: int,
                       max_decoded_bytes: int = MAX_DECODED_BYTES) -> list[list[Any]]:
    """Queue records of the (topic, queue_id)s of `wanted` that cover one of its queue offsets,
    oldest first, at most `limit`; only segments whose summary covers one are decoded, at most
    `max_decoded_bytes` of them (oldest first: what happens to a message follows its store)."""
    found: list[list[Any]] = []
    budget = max_decoded_bytes
    for view in views:
        if not any(_spans(view.summary.get(queue), offsets) for queue, offsets in wanted.items()):
            continue
        budget -= view.size
        if budget < 0:
            break
        for record in read_records(view.path, view.size):
            covered = _covered(record)
            if covered is None:
                continue
            offsets = wanted.get((covered[0], covered[1]))
            if offsets and _matches(record, offsets):
                found.append(record)
                if len(found) >= limit:
                    return found
    return found


def _spans(span: list[int] | None, offsets: set[int]) -> bool:
    return span is not None and any(span[0] <= o <= span[1] for o in offsets)


def _matches(record: Sequence[Any], offsets: set[int]) -> bool:
    covered = _covered(record)
    assert covered is not None
    if record[0] in (POPPED, SENT_SET, COMMITTED_RUN):
        return any(o in offsets for o in record[4])
    stride = _RUNS.get(record[0])
    if stride is not None:
        runs = record[4]
        return any(runs[i] <= o < runs[i + 1] for i in range(0, len(runs) - stride + 1, stride) for o in offsets)
    return any(covered[2] <= o <= covered[3] for o in offsets)
