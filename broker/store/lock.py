"""`StoreLock`: one broker per store directory (RocketMQ `DefaultMessageStore#start` takes a file
lock on `<store>/lock` and fails with "Lock failed, MQ already started").

The lock is `flock(LOCK_EX | LOCK_NB)` on `<store>/lock`, held by an open descriptor for the
broker's life: the kernel drops it when the process exits, however it exits, so a crash never leaves
a stale lock. Being per open file (not per process, unlike `lockf`), it also keeps a second broker
in the same process out. The file holds its holder's `pid=` and `host=` lines, for the refusal
message only: the lock, not the file's content, decides."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger(__name__)
LOCK_FILE_NAME = "lock"


class StoreLocked(OSError):
    """Another process (or another broker in this one) holds the store directory's lock. An
    `OSError` (errno EAGAIN, filename the lock file), so the command line reports it as the one line
    `str(err)`; `holder_pid` / `holder_host` are None when the holder had not written them yet."""

    def __init__(self, store_path: Path, holder_pid: int | None, holder_host: str | None) -> None:
        holder = f"pid {holder_pid}" if holder_pid is not None else "a process whose pid is not written yet"
        if holder_host:
            holder += f" on {holder_host}"
        self.message = (f"store directory {store_path} is in use by another broker ({holder} holds "
                        f"{store_path / LOCK_FILE_NAME}); stop it or give this broker another --store-dir")
        super().__init__(errno.EAGAIN, self.message, str(store_path / LOCK_FILE_NAME))
        self.store_path, self.holder_pid, self.holder_host = store_path, holder_pid, holder_host

    def __str__(self) -> str:
        return self.message


def read_holder(lock_path: Path) -> tuple[int | None, str | None]:
    """(pid, host) written in a lock file; None for what is missing or unreadable."""
    try:
        fields = dict(line.partition("=")[::2] for line in lock_path.read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError):
        return None, None
    pid = fields.get("pid", "")
    return (int(pid) if pid.isdigit() else None), (fields.get("host") or None)


class StoreLock:
    """`acquire()` before anything reads or writes the store, `release()` after the last write."""

    def __init__(self, store_path: Path) -> None:
        self.store_path = store_path
        self.path = store_path / LOCK_FILE_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Create the directory if missing, take the lock, write this process's pid and host into the
        file. Raises `StoreLocked` when it is held elsewhere (the file is left as it was), or the
        `OSError` of creating or opening it."""
        if self._fd is not None:
            return
        self.store_path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLocked(self.store_path, *read_holder(self.path)) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid={os.getpid()}\nhost={socket.gethostname()}\n".encode(), 0)
        except OSError as exc:      # the lock is what counts; the note is for the refusal message
            log.warning("store lock %s taken but its holder note not written: %s", self.path, exc)
        self._fd = fd
        log.debug("store lock %s taken by pid %d", self.path, os.getpid())

    def release(self) -> None:
        """Empty the holder note, unlock and close; nothing when not held."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError as exc:
            log.debug("could not empty store lock %s: %s", self.path, exc)
        finally:
            os.close(fd)     # closing the last descriptor of the open file releases the flock
