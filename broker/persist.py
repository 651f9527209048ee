"""State files under `<store>/config/`: strict JSON written atomically (temp file, fsync, rename),
PROTOCOL.md deliberate difference 6 (RocketMQ writes fastjson with unquoted integer keys)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from broker.atomic import write_bytes_atomic
from protocol.service import Service

log = logging.getLogger(__name__)


def write_json_atomic(path: Path, value: Any) -> None:
    """Write `value` as JSON to `path` so that a reader sees the old or the new file, never a torn one."""
    write_bytes_atomic(path, json.dumps(value, indent=1, sort_keys=True, allow_nan=False).encode())


def read_json(path: Path) -> Any | None:
    """The JSON value in `path`, or None when the file does not exist. A file that is not valid
    JSON raises `ValueError` naming it: the broker refuses to start rather than lose state."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"state file {path} is not valid JSON: {exc}") from exc


class DirtyState:
    """Base of the managers persisted by `ConfigPersistService`: `dirty` says the file is stale."""

    def __init__(self) -> None:
        self._dirty = False

    def touch(self) -> None:
        self._dirty = True

    @property
    def dirty(self) -> bool:
        return self._dirty

    def mark_clean(self) -> None:
        self._dirty = False


class Persistent(Protocol):
    """A manager whose state is one JSON file."""

    file_name: str

    @property
    def dirty(self) -> bool: ...

    def to_json(self) -> Any: ...

    def load_json(self, value: Any) -> None: ...

    def mark_clean(self) -> None: ...


class ConfigPersistService(Service):
    """Every `interval_ms` (and at stop), writes each dirty manager's file under `config_dir`."""

    name = "config-persist"

    def __init__(self, config_dir: Path, managers: Sequence[Persistent], interval_ms: int,
                 write: Callable[[Path, Any], None] = write_json_atomic) -> None:
        super().__init__()
        self._dir, self._managers, self._interval_ms, self._write = config_dir, managers, interval_ms, write

    def load(self) -> None:
        for manager in self._managers:
            value = read_json(self._dir / manager.file_name)
            if value is not None:
                manager.load_json(value)
                manager.mark_clean()

    def persist_all(self, *, force: bool = False) -> None:
        for manager in self._managers:
            if manager.dirty or force:
                manager.mark_clean()
                self._write(self._dir / manager.file_name, manager.to_json())

    async def run(self) -> None:
        while await self.wait(self._interval_ms):
            try:
                self.persist_all()
            except OSError:
                log.exception("could not persist state to %s; will retry", self._dir)
        self.persist_all(force=True)
