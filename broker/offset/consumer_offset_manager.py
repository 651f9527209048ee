"""Committed consumer offsets (RocketMQ `ConsumerOffsetManager`, REFERENCE.md §8).

Table `topic@group` → {queue_id → queue_offset}. `commit` overwrites (a lower value is accepted and
logged, as RocketMQ). Persisted as strict JSON `config/consumer_offsets.json` (queue ids as string
keys) within `persist_interval_ms` of a commit and at a clean stop."""

from __future__ import annotations

import logging
from typing import Any

from broker.persist import DirtyState

log = logging.getLogger(__name__)
TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(DirtyState):
    file_name = "consumer_offsets.json"

    def __init__(self) -> None:
        self._table: dict[str, dict[int, int]] = {}
        super().__init__()

    def commit(self, client: str, group: str, topic: str, queue_id: int, queue_offset: int) -> None:
        key = f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"
        queues = self._table.setdefault(key, {})
        previous = queues.get(queue_id)
        if previous is not None and queue_offset < previous:
            log.info("offset of %s on %s:%d moved back from %d to %d by %s",
                     group, topic, queue_id, previous, queue_offset, client)
        if previous != queue_offset:
            queues[queue_id] = queue_offset
            self.touch()

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        queues = self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}")
        return None if queues is None else queues.get(queue_id)

    def offsets_of_group(self, group: str) -> dict[str, dict[int, int]]:
        """topic → {queue_id → offset} for one group."""
        result: dict[str, dict[int, int]] = {}
        for key, queues in self._table.items():
            topic, _, key_group = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if key_group == group:
                result[topic] = dict(queues)
        return result

    def groups_of_topic(self, topic: str) -> set[str]:
        prefix = topic + TOPIC_GROUP_SEPARATOR
        return {key[len(prefix):] for key in self._table if key.startswith(prefix)}

    def to_json(self) -> Any:
        return {"offset_table": {key: {str(q): o for q, o in sorted(queues.items())}
                                 for key, queues in sorted(self._table.items())}}

    def load_json(self, value: Any) -> None:
        for key, queues in value.get("offset_table", {}).items():
            self._table[key] = {int(q): int(o) for q, o in queues.items()}
