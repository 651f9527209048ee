"""Committed consumer offsets (RocketMQ `ConsumerOffsetManager`, REFERENCE.md §8).

Table `topic@group` → {queue_id → queue_offset}. `commit` overwrites (a lower value is accepted and
logged, as RocketMQ). Persisted as strict JSON `config/consumer_offsets.json` (queue ids as string
keys) within `persist_interval_ms` of a commit and at a clean stop.

Beside it, in memory only, the pull offsets (RocketMQ 5 `pullOffsetTable`): the `next_begin_offset`
last answered to a group's pull of a queue. Pull offset minus committed offset is what the group
has in flight; max offset minus pull offset is what is ready and not pulled yet (the metrics)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from broker.persist import DirtyState

log = logging.getLogger(__name__)
TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(DirtyState):
    file_name = "consumer_offsets.json"

    def __init__(self) -> None:
        self._table: dict[str, dict[int, int]] = {}
        self._pull_table: dict[tuple[str, str, int], int] = {}     # (group, topic, queue_id) → offset
        # called with (client, group, topic, queue_id, previous offset or None, new offset) when a
        # commit moves an offset (the message trace's COMMITTED records)
        self.on_commit: Callable[[str, str, str, int, int | None, int], None] | None = None
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
            if self.on_commit is not None:
                self.on_commit(client, group, topic, queue_id, previous, queue_offset)

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        queues = self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}")
        return None if queues is None else queues.get(queue_id)

    def record_pull(self, group: str, topic: str, queue_id: int, next_begin_offset: int) -> None:
        """Remember where the group's next pull of the queue starts (not persisted)."""
        self._pull_table[(group, topic, queue_id)] = next_begin_offset

    def pull_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._pull_table.get((group, topic, queue_id))

    def reset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Overwrite the group's committed offsets of `topic` (admin offset reset); the pull offsets
        of those queues are forgotten, since the consumers reload the queues from the new ones."""
        queues = self._table.setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})
        for queue_id, queue_offset in offsets.items():
            queues[queue_id] = queue_offset
            self._pull_table.pop((group, topic, queue_id), None)
        self.touch()

    def remove_group(self, group: str) -> None:
        """Forget every offset of `group` (the group was deleted)."""
        for key in [k for k in self._table if k.rpartition(TOPIC_GROUP_SEPARATOR)[2] == group]:
            del self._table[key]
        for pull_key in [k for k in self._pull_table if k[0] == group]:
            del self._pull_table[pull_key]
        self.touch()

    def remove_topic(self, topic: str) -> None:
        """Forget every offset on `topic` (the topic was deleted)."""
        prefix = topic + TOPIC_GROUP_SEPARATOR
        for key in [k for k in self._table if k.startswith(prefix)]:
            del self._table[key]
        for pull_key in [k for k in self._pull_table if k[1] == topic]:
            del self._pull_table[pull_key]
        self.touch()

    def all_offsets(self) -> list[tuple[str, str, dict[int, int]]]:
        """(group, topic, {queue_id → committed offset}) for every pair with a commit, sorted."""
        result = []
        for key, queues in sorted(self._table.items()):
            topic, _, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
            result.append((group, topic, dict(queues)))
        return result

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
