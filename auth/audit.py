"""`AuditLog`: one JSON line per authentication/authorization decision, written by a thread of its
own so the event loop never waits for the disk.

    {"time": "2025-01-02T03:04:05.678Z", "peer": "10.1.2.3", "user": "billing", "code": 11,
     "resource": "Group:g1", "action": "Sub", "decision": "deny", "reason": "no matching Allow entry"}

`user` is the access key the request claimed (null when unsigned); `reason` is the detailed cause
the client is never told ("bad signature", "replayed", ...). No password, key or signature is ever
written. `record` only appends a tuple to a bounded queue (the formatting is the thread's): when
the disk falls behind by `max_queued` decisions, further ones are dropped and counted, and a line
`{"dropped": n}` says so. The file is rotated past `max_bytes` (one previous file kept, `.1`)."""

from __future__ import annotations

import datetime
import json
import logging
import os
import queue
import threading
from pathlib import Path

log = logging.getLogger(__name__)
Decision = tuple[int, str, "str | None", int, str, str, str, str]
# (time ms, peer ip, user, request code, resource, action, "allow"/"deny", reason)
MAX_BYTES = 64 * 1024 * 1024


def format_decision(decision: Decision) -> str:
    """The JSON line of one decision (no trailing newline)."""
    at_ms, peer, user, code, resource, action, verdict, reason = decision
    at = datetime.datetime.fromtimestamp(at_ms / 1000, datetime.UTC)
    return json.dumps({"time": at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at_ms % 1000:03d}Z", "peer": peer,
                       "user": user, "code": code, "resource": resource, "action": action, "decision": verdict,
                       "reason": reason}, ensure_ascii=False)


class _Flush:
    """A marker in the queue: `done` is set once everything queued before it is written."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class AuditLog:
    """`start()` opens `path` (mode 0600, appending) and starts the writer; `record(...)` from any
    thread; `close()` writes what is queued (bounded by `timeout_s`) and stops. Raises `OSError`
    from `start` when the file cannot be opened."""

    def __init__(self, path: Path, *, max_queued: int = 65_536, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.dropped = 0
        self.written = 0
        self._queue: queue.Queue[Decision | _Flush | None] = queue.Queue(max_queued)   # None: stop
        self._thread: threading.Thread | None = None
        self._file: int | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._thread = threading.Thread(target=self._run, name="auth-audit", daemon=True)
        self._thread.start()

    def record(self, decision: Decision) -> None:
        """Queue one decision; never blocks (dropped and counted when the queue is full)."""
        try:
            self._queue.put_nowait(decision)
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every decision queued so far is written (tests, shutdown); False on timeout."""
        marker = _Flush()
        try:
            self._queue.put(marker, timeout=timeout_s)
        except queue.Full:
            return False
        return marker.done.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            log.warning("audit log %s: writer stuck; %d decisions not written", self.path, self._queue.qsize())
        thread.join(timeout_s)
        if self._file is not None and not thread.is_alive():
            os.close(self._file)
            self._file = None

    def _run(self) -> None:
        reported = 0
        while True:
            item = self._queue.get()
            lines: list[str] = []
            flushes: list[_Flush] = []
            stop = False
            while True:       # everything queued now goes out in one write
                if item is None:
                    stop = True
                elif isinstance(item, _Flush):
                    flushes.append(item)
                else:
                    lines.append(format_decision(item))
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if self.dropped != reported:
                lines.append(json.dumps({"dropped": self.dropped - reported}))
                reported = self.dropped
            self._write(lines)
            for flush in flushes:
                flush.done.set()
            if stop:
                return

    def _write(self, text: list[str]) -> None:
        if text and self._file is not None:
            try:
                os.write(self._file, ("\n".join(text) + "\n").encode())
                self.written += len(text)
                if os.fstat(self._file).st_size > self.max_bytes:
                    self._rotate()
            except OSError as exc:
                log.warning("audit log %s: cannot write (%s); %d decisions lost", self.path, exc, len(text))

    def _rotate(self) -> None:
        assert self._file is not None
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        os.close(self._file)
        self._file = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
