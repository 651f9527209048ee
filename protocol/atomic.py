"""Atomic file replacement for state files: a reader sees the old or the new content, never a torn
one, and the new content survives a machine crash once this returns. Shared by the broker's state
files and `auth.store` (the name server's too), so it lives below both."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_bytes_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a temporary file beside `path` (created with `mode`, e.g. 0o600 for a file
    of secrets), fsync it, rename it over `path`, fsync the directory. Raises `OSError` (the old
    file is then untouched)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
