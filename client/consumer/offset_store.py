"""Consumer offset stores (REFERENCE.md §8): the broker's for clustering, a local strict-JSON file
for broadcasting. Both keep offsets in memory; `persist_all` writes them out."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Protocol

from client.api import ClientAPI
from client.route import RouteTable
from protocol.errors import MQError, ResponseError
from protocol.model import MessageQueue

log = logging.getLogger(__name__)
DEFAULT_OFFSET_DIR = Path.home() / ".rocketq" / "offsets"   # broadcasting offsets, per client id and group
NOT_FOUND = -1        # the store has no offset for the queue
READ_FAILED = -2      # the store could not be asked (the queue is skipped this rebalance)
OffsetUpdate = Callable[[MessageQueue, int], None]
"""How a consume service records a queue's consumed offset: `update_offset(mq, queue_offset)`."""


class ReadOffsetType(Enum):
    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


class OffsetStore(Protocol):
    async def load(self) -> None: ...

    def update_offset(self, mq: MessageQueue, queue_offset: int, increase_only: bool) -> None: ...

    def memory_offset(self, mq: MessageQueue) -> int | None: ...

    async def read_offset(self, mq: MessageQueue, read_type: ReadOffsetType) -> int: ...

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...

    async def persist(self, mq: MessageQueue) -> None: ...

    def remove_offset(self, mq: MessageQueue) -> None: ...


class _MemoryOffsets:
    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    def update_offset(self, mq: MessageQueue, queue_offset: int, increase_only: bool) -> None:
        """Set the offset; with `increase_only` it only moves forward (RocketMQ's CAS loop)."""
        current = self.table.get(mq)
        if current is None or not increase_only or queue_offset > current:
            self.table[mq] = queue_offset

    def memory_offset(self, mq: MessageQueue) -> int | None:
        return self.table.get(mq)

    def remove_offset(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)


class RemoteBrokerOffsetStore(_MemoryOffsets):
    """Clustering: offsets live on the queue's broker (QUERY/UPDATE_CONSUMER_OFFSET)."""

    def __init__(self, api: ClientAPI, routes: RouteTable, default_address: str, consumer_group: str,
                 timeout_ms: int = 5_000) -> None:
        super().__init__()
        self._api, self._routes, self._default = api, routes, default_address
        self._group, self._timeout_ms = consumer_group, timeout_ms

    async def load(self) -> None:
        return None

    def _address(self, mq: MessageQueue) -> str:
        return self._routes.master_address(mq.broker_name) or self._default

    async def read_offset(self, mq: MessageQueue, read_type: ReadOffsetType) -> int:
        if read_type is not ReadOffsetType.READ_FROM_STORE:
            value = self.table.get(mq)
            if value is not None or read_type is ReadOffsetType.READ_FROM_MEMORY:
                return NOT_FOUND if value is None else value
        try:
            queue_offset = await self._api.query_consumer_offset(self._address(mq), self._group, mq.topic,
                                                                 mq.queue_id, self._timeout_ms)
        except ResponseError:
            return NOT_FOUND            # QUERY_NOT_FOUND and other broker answers: no offset
        except MQError as exc:
            log.info("cannot read offset of %s: %s", mq, exc)
            return READ_FAILED
        self.update_offset(mq, queue_offset, increase_only=False)
        return queue_offset

    async def persist(self, mq: MessageQueue) -> None:
        queue_offset = self.table.get(mq)
        if queue_offset is None:
            return
        try:
            await self._api.update_consumer_offset(self._address(mq), self._group, mq.topic, mq.queue_id,
                                                   queue_offset, oneway=True)
        except MQError as exc:
            log.info("cannot persist offset %d of %s: %s", queue_offset, mq, exc)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        """UPDATE_CONSUMER_OFFSET (one-way) for the assigned queues; offsets of queues no longer
        assigned are dropped from memory (RocketMQ `persistAll`)."""
        assigned = set(mqs)
        for mq in list(self.table):
            if mq in assigned:
                await self.persist(mq)
            else:
                del self.table[mq]


class LocalFileOffsetStore(_MemoryOffsets):
    """Broadcasting: offsets in `<dir>/<client_id>/<group>/offsets.json`, strict JSON
    `{"offset_table": [{"topic", "broker_name", "queue_id", "offset"}, ...]}` written atomically."""

    def __init__(self, root: Path, client_id: str, consumer_group: str) -> None:
        super().__init__()
        self.path = root / client_id.replace("/", "_") / consumer_group / "offsets.json"

    async def load(self) -> None:
        for mq, queue_offset in self._read_file().items():
            self.table[mq] = queue_offset

    def _read_file(self) -> dict[MessageQueue, int]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (json.JSONDecodeError, OSError) as exc:
            raise ValueError(f"offset file {self.path} is unreadable: {exc}") from exc
        return {MessageQueue(e["topic"], e["broker_name"], int(e["queue_id"])): int(e["offset"])
                for e in raw.get("offset_table", [])}

    async def read_offset(self, mq: MessageQueue, read_type: ReadOffsetType) -> int:
        if read_type is not ReadOffsetType.READ_FROM_STORE:
            value = self.table.get(mq)
            if value is not None or read_type is ReadOffsetType.READ_FROM_MEMORY:
                return NOT_FOUND if value is None else value
        stored = self._read_file().get(mq)
        if stored is None:
            return NOT_FOUND
        self.update_offset(mq, stored, increase_only=False)
        return stored

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all(self.table)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        wanted = set(mqs)
        entries = [{"topic": mq.topic, "broker_name": mq.broker_name, "queue_id": mq.queue_id, "offset": o}
                   for mq, o in sorted(self.table.items()) if mq in wanted]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump({"offset_table": entries}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
