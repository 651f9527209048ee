"""Offline store consistency check (`rocketq store check --store-dir DIR`, issue 12).

Every consume-queue unit from its queue's first readable offset to its written end must point at
an intact commit-log record: a record starting exactly at the unit's `commit_log_offset`, whose
`total_size` equals the unit's size, whose CRC matches, and whose payload names the same topic,
queue_id, queue_offset and commit_log_offset. Units below the commit log's first file (removed by
retention) are counted, not errors. Files are opened read-only and mapped read-only, and segment
sizes come from the files themselves, so no configuration is needed. Run it on a stopped broker's
store: a running broker may be writing the tail."""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path

from broker.store.consume_queue import BLANK_SIZE, CQ_UNIT, UNIT_BYTES, is_valid_topic_name
from broker.store.record import HEADER_BYTES, RecordError, decode_stored_fields, record_size_at
from broker.store.segment import segment_files
from protocol.message import F_COMMIT_LOG_OFFSET, F_QUEUE_ID, F_QUEUE_OFFSET, F_TOPIC

MAX_PROBLEMS_KEPT = 50


@dataclass(slots=True)
class CheckReport:
    queues: int = 0
    units: int = 0                    # units checked against the commit log
    below_commit_log: int = 0         # units whose record was removed by retention
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS_KEPT:
            self.problems.append(text)


class _ReadOnlyLog:
    """Commit-log segments mapped read-only, looked up by byte offset."""

    def __init__(self, directory: Path) -> None:
        self.maps: dict[int, mmap.mmap] = {}
        self.segment_bytes = 0
        for path in segment_files(directory):
            size = path.stat().st_size
            if size == 0:
                continue
            self.segment_bytes = size
            with path.open("rb") as file:
                self.maps[int(path.name)] = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
        self.min_offset = min(self.maps, default=0)

    def record(self, commit_log_offset: int, size: int) -> tuple[mmap.mmap, int] | str:
        """(map, position) of the intact record at `commit_log_offset`, or what is wrong."""
        if not self.segment_bytes:
            return "the commit log has no files"
        start = commit_log_offset - commit_log_offset % self.segment_bytes
        segment = self.maps.get(start)
        if segment is None:
            return f"no commit-log file holds offset {commit_log_offset}"
        position = commit_log_offset - start
        total = record_size_at(segment, position, len(segment))
        if total <= 0:
            return f"no intact record at commit-log offset {commit_log_offset} (size or CRC)"
        if total != size:
            return f"record at {commit_log_offset} has {total} bytes, the unit says {size}"
        return segment, position

    def close(self) -> None:
        for segment in self.maps.values():
            segment.close()


def check_store(store_dir: Path) -> CheckReport:
    """Check every consume queue of the store at `store_dir` against its commit log."""
    report = CheckReport()
    log = _ReadOnlyLog(store_dir / "commitlog")
    try:
        root = store_dir / "consumequeue"
        topics = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        for topic_dir in topics:
            if not is_valid_topic_name(topic_dir.name):
                report.problem(f"unexpected consume-queue directory {topic_dir}")
                continue
            for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir()):
                if not queue_dir.name.isdigit():
                    report.problem(f"unexpected consume-queue directory {queue_dir}")
                    continue
                report.queues += 1
                _check_queue(log, topic_dir.name, int(queue_dir.name), queue_dir, report)
    finally:
        log.close()
    return report


def _check_queue(log: _ReadOnlyLog, topic: str, queue_id: int, directory: Path, report: CheckReport) -> None:
    for path in segment_files(directory):
        data = path.read_bytes()
        data = data[:len(data) // UNIT_BYTES * UNIT_BYTES]
        first_queue_offset = int(path.name) // UNIT_BYTES
        for index, (commit_log_offset, size, _) in enumerate(CQ_UNIT.iter_unpack(data)):
            if size == 0:
                break                           # the written end of this file
            if size == BLANK_SIZE:
                continue
            queue_offset = first_queue_offset + index
            where = f"{topic}:{queue_id} queue offset {queue_offset}"
            if commit_log_offset < log.min_offset:
                report.below_commit_log += 1
                continue
            report.units += 1
            found = log.record(commit_log_offset, size)
            if isinstance(found, str):
                report.problem(f"{where}: {found}")
                continue
            segment, position = found
            try:
                fields = decode_stored_fields(segment[position + HEADER_BYTES:position + size])
            except RecordError as exc:
                report.problem(f"{where}: record at {commit_log_offset} does not decode: {exc}")
                continue
            expected = [topic, queue_id, queue_offset, commit_log_offset]
            stored = [fields[F_TOPIC], fields[F_QUEUE_ID], fields[F_QUEUE_OFFSET], fields[F_COMMIT_LOG_OFFSET]]
            if stored != expected:
                report.problem(f"{where}: record at {commit_log_offset} is {stored}, expected {expected}")
