"""Putting due timer messages back into their real topic and queue (RocketMQ 5
`TimerMessageStore#convertMessage` + `doPut`): the stored message is read from the commit log,
its properties lose the timer keys, and runs of messages bound for the same queue are appended
with one `put_scheduled` keeping each message's origin (born time and host, reconsume times)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from broker.store.message_store import MessageStore
from broker.store.record import RecordError, decode_stored_fields
from broker.store.results import PutMessageStatus
from broker.timer.deliver_time import without_timer_properties
from protocol.message import F_BODY, F_FLAG, F_PROPERTIES, PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, stored_origin

log = logging.getLogger(__name__)

Due = tuple[int, int]     # (commit_log_offset, size) of a message in the timer topic


def deliver(store: MessageStore, due: Iterable[Due]) -> int | None:
    """Put the messages at `due` to their real queues, in order within each queue. Returns the
    commit-log end of what was written (0 if nothing), or None when a put failed for a reason
    that may pass (the disk, the store stopping): the caller retries the whole run later, so a
    queue may receive a message twice (at least once, never lost). A message that cannot be read
    or names no real topic is logged and skipped for good, as is one the store refuses as
    MESSAGE_ILLEGAL (its real topic's name or size no longer allowed)."""
    runs: dict[tuple[str, int], tuple[list[tuple[dict[str, str], int, bytes]],
                                      list[tuple[int, str, int, int]]]] = {}
    for commit_log_offset, size in due:
        payload = store.read_payload(commit_log_offset, size)
        try:
            if payload is None:
                raise RecordError(f"no record at commit log offset {commit_log_offset}")
            fields = decode_stored_fields(payload)
            properties: dict[str, str] = fields[F_PROPERTIES]
            key = (properties[PROPERTY_REAL_TOPIC], int(properties[PROPERTY_REAL_QUEUE_ID]))
        except (RecordError, KeyError, ValueError, TypeError) as exc:
            log.error("timer: skipping the message at commit log offset %d (%d bytes): %s",
                      commit_log_offset, size, exc)
            continue
        run = runs.get(key)
        if run is None:
            run = runs[key] = ([], [])
        run[0].append((without_timer_properties(properties), fields[F_FLAG], fields[F_BODY]))
        run[1].append(stored_origin(fields))
    end_offset = 0
    for (topic, queue_id), (messages, origins) in runs.items():
        result = store.put_scheduled(topic=topic, queue_id=queue_id, messages=messages, origins=origins)
        if result.status is PutMessageStatus.MESSAGE_ILLEGAL:
            log.error("timer: the store refused %d messages for %s:%d; skipping them", len(messages), topic, queue_id)
            continue
        if result.status is not PutMessageStatus.PUT_OK:
            log.warning("timer: delivery to %s:%d failed (%s); retrying", topic, queue_id, result.status.name)
            return None
        end_offset = result.end_offset
    return end_offset
