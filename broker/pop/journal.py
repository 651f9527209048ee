"""`PopJournal`: the durable record of POP state changes, as RocketMQ writes CK and ACK messages to
its revive topic: every change is a small message in `rmq_sys_REVIVE_LOG_<cluster>` (queue 0) of
the crash-safe store, written before the change is applied or answered; a snapshot of the whole
state (`config/pop_state.msgpack`, atomic replace) names the revive-queue offset it covers, so a
restart loads the snapshot and replays only the records after it.

Records (msgpack arrays, the body of each revive message):

- `["init", group, topic, queue_id, next_offset]`: a queue's pop offset first set;
- `["ck", group, topic, queue_id, ck_id, deadline_ms, next_offset, [[queue_offset, reconsume_times], ...]]`:
  a pop (RocketMQ's CK);
- `["ack", group, topic, queue_id, ck_id, queue_offset]`: an ack, or an expired message sent to the DLQ
  (RocketMQ's ACK);
- `["acks", group, topic, -1, [[queue_id, ck_id, queue_offset], ...]]`: a BATCH_ACK_MESSAGE;
- `["chg", group, topic, queue_id, ck_id, queue_offset, new_ck_id, deadline_ms]`: a change of invisible
  time (RocketMQ writes a new CK and acks the old one)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from broker.processors.send_message import check_put
from broker.store.message_store import MessageStore
from broker.store.results import GetMessageStatus
from protocol.atomic import write_bytes_atomic
from protocol.message import F_BODY

log = logging.getLogger(__name__)

REVIVE_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"
_READ_BATCH = 32


def revive_topic(cluster_name: str) -> str:
    """RocketMQ's `rmq_sys_REVIVE_LOG_<cluster>` (a system topic by its `rmq_sys_` prefix)."""
    return REVIVE_TOPIC_PREFIX + cluster_name


class PopJournal:
    def __init__(self, store: MessageStore, topic: str, snapshot_path: Path, store_host: str) -> None:
        self._store, self.topic, self._snapshot_path = store, topic, snapshot_path
        self._store_host = store_host
        self._pack = msgpack.Packer().pack      # (`packb` makes a Packer per call)

    def append(self, record: list[Any]) -> None:
        """Store one record; raises the put's error (SERVICE_NOT_AVAILABLE when the disk is full...),
        in which case the caller changes nothing."""
        result = self._store.put_checked_message(     # (a system topic's queue 0, no DELAY, a small body)
            topic=self.topic, queue_id=0, body=self._pack(record), properties={}, flag=0, born_timestamp=0,
            born_host=self._store_host, reconsume_times=0)
        check_put(result)

    @property
    def end_offset(self) -> int:
        return self._store.get_max_offset(self.topic, 0)

    def replay(self, from_offset: int) -> Iterator[list[Any]]:
        """The records from queue offset `from_offset` to the end, in order (a gap left by retention
        is logged and skipped)."""
        queue_offset = from_offset
        while True:
            result = self._store.get_message(self.topic, 0, queue_offset, _READ_BATCH, None)
            if result.status is not GetMessageStatus.FOUND:
                if result.next_begin_offset > queue_offset and result.status is not \
                        GetMessageStatus.NO_MESSAGE_IN_QUEUE and queue_offset < result.max_offset:
                    log.warning("pop journal: records %d..%d are gone (retention); state may lag",
                                queue_offset, result.next_begin_offset)
                    queue_offset = result.next_begin_offset
                    continue
                return
            for payload in result.messages:
                fields = msgpack.unpackb(payload, raw=False)
                yield msgpack.unpackb(fields[F_BODY], raw=False, strict_map_key=False)
            queue_offset = result.next_begin_offset

    def load_snapshot(self) -> tuple[int, int, list[Any]]:
        """(revive offset covered, next ck_id, queue states) of the last snapshot; (0, 1, [])
        without one."""
        try:
            data = self._snapshot_path.read_bytes()
        except FileNotFoundError:
            return 0, 1, []
        offset, next_ck_id, queues = msgpack.unpackb(data, raw=False, strict_map_key=False)
        return int(offset), int(next_ck_id), list(queues)

    def write_snapshot(self, covered_offset: int, next_ck_id: int, queues: list[Any]) -> None:
        write_bytes_atomic(self._snapshot_path, msgpack.packb([covered_offset, next_ck_id, queues]))
