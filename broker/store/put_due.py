"""Putting due messages back into their real topic and queue, for delay levels (RocketMQ
`ScheduleMessageService.DeliverDelayedMessageTimerTask`) and timer messages (RocketMQ 5
`TimerMessageStore#convertMessage` + `doPut`): each stored message is read from the commit log,
its properties cleaned by the caller's rule (the DELAY level, or the timer keys, removed), and
runs of messages bound for the same queue are appended with one `put_scheduled` keeping each
message's origin (born time and host, reconsume times)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from broker.store.message_store import MessageStore
from broker.store.record import RecordError, decode_stored_fields
from broker.store.results import PutMessageStatus
from protocol.message import F_BODY, F_FLAG, F_PROPERTIES, PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, stored_origin

log = logging.getLogger(__name__)

Due = tuple[int, int]     # (commit_log_offset, size) of a message in the timer or schedule topic
Properties = dict[str, str]
Route = Callable[[Properties], tuple[str, int, Properties]]


def to_real_queue(clean: Callable[[Properties], Properties]) -> Route:
    """The usual route: (REAL_TOPIC, REAL_QID, `clean(properties)`); raises KeyError / ValueError."""
    def route(properties: Properties) -> tuple[str, int, Properties]:
        return properties[PROPERTY_REAL_TOPIC], int(properties[PROPERTY_REAL_QUEUE_ID]), clean(properties)
    return route


def put_due(store: MessageStore, due: Iterable[Due], clean: Callable[[Properties], Properties], label: str,
            on_put: Callable[[int], None] | None = None, *, route: Route | None = None) -> int | None:
    """Put the messages at `due` to their real queues (REAL_TOPIC, REAL_QID), in order within each
    queue, with `clean(properties)` as their properties; `label` starts the log lines ("timer",
    "schedule level 3"); `on_put(count)` after each queue's run is stored. Returns the
    commit-log end of what was written (0 if nothing), or None when a put failed for a reason
    that may pass (the disk, the store stopping): the caller retries the whole run later, so a
    queue may receive a message twice (at least once, never lost). A message that cannot be read
    or names no real topic is logged and skipped for good, as is one the store refuses as
    MESSAGE_ILLEGAL (its real topic's name or size no longer allowed). A `route` replaces the
    usual `to_real_queue(clean)`: `route(properties)` gives each one's (topic, queue_id,
    properties) (the timer's roll puts a message not yet due back into the timer topic that way)."""
    if route is None:
        route = to_real_queue(clean)
    runs: dict[tuple[str, int], tuple[list[tuple[dict[str, str], int, bytes]],
                                      list[tuple[int, str, int, int]]]] = {}
    for commit_log_offset, size in due:
        payload = store.read_payload(commit_log_offset, size)
        try:
            if payload is None:
                raise RecordError(f"no record at commit log offset {commit_log_offset}")
            fields = decode_stored_fields(payload)
            topic, queue_id, properties = route(fields[F_PROPERTIES])
            key = (topic, queue_id)
        except (RecordError, KeyError, ValueError, TypeError) as exc:
            log.error("%s: skipping the message at commit log offset %d (%d bytes): %s",
                      label, commit_log_offset, size, exc)
            continue
        run = runs.get(key)
        if run is None:
            run = runs[key] = ([], [])
        run[0].append((properties, fields[F_FLAG], fields[F_BODY]))
        run[1].append(stored_origin(fields))
    end_offset = 0
    for (topic, queue_id), (messages, origins) in runs.items():
        result = store.put_scheduled(topic=topic, queue_id=queue_id, messages=messages, origins=origins)
        if result.status is PutMessageStatus.MESSAGE_ILLEGAL:
            log.error("%s: the store refused %d messages for %s:%d; skipping them", label, len(messages), topic,
                      queue_id)
            continue
        if result.status is not PutMessageStatus.PUT_OK:
            log.warning("%s: delivery to %s:%d failed (%s); retrying", label, topic, queue_id, result.status.name)
            return None
        end_offset = result.end_offset
        if on_put is not None:
            on_put(len(messages))
    return end_offset
