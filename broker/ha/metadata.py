"""What a slave copies from its master besides the commit log (RocketMQ `SlaveSynchronize`: topic
configs, subscription groups, consumer offsets, delay offsets), so a takeover resumes where
consumers were. The master sends the snapshot on the replication stream every
`ha_slave_sync_interval_ms` (RocketMQ's slave asks for each table by request instead); the slave
loads each table that changed since the last one and persists it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgpack

from broker.persist import DurableTable, Persistent

log = logging.getLogger(__name__)


def snapshot(tables: Sequence[Persistent]) -> bytes:
    """msgpack {file_name: the table's JSON value} of every table."""
    packed: bytes = msgpack.packb({table.file_name: table.to_json() for table in tables}, use_bin_type=True)
    return packed


def version(tables: Sequence[Persistent]) -> int:
    """A number that moves with every change of the tables whose changes a record may depend on
    (the `DurableTable`s: topics, subscription groups), not with consumer or delay offsets."""
    return sum(table.generation for table in tables if isinstance(table, DurableTable))


class MetadataApplier:
    """Loads a master's snapshots into this broker's tables (only the ones that changed)."""

    def __init__(self, tables: Sequence[Persistent]) -> None:
        self._tables = {table.file_name: table for table in tables}
        self._last: dict[str, Any] = {}
        self.applied = 0

    def apply(self, data: bytes) -> None:
        """Load every table of the snapshot `data` whose value differs from the last one loaded;
        an undecodable snapshot or table is logged and skipped."""
        try:
            values = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            log.error("master metadata snapshot undecodable: %s", exc)
            return
        if not isinstance(values, dict):
            return
        for name, value in values.items():
            table = self._tables.get(name)
            if table is None or self._last.get(name) == value:
                continue
            try:
                table.load_json(value)
            except Exception as exc:
                log.error("master metadata %s not loaded: %s", name, exc)
                continue
            self._last[name] = value
            if isinstance(table, DurableTable):
                table.changed("*")
            else:
                table.touch()
        self.applied += 1
