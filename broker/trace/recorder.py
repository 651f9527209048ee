"""`TraceRecorder`: the request paths' side of the message trace. Each event is one tuple appended
to a bounded deque (the processors call one method per event; nothing is encoded or written
there); `drain` turns what waited into trace records for `TraceService` to write. Past
`queue_max_events` waiting events new ones are dropped and counted (`dropped`), so a send or a pull
never waits for the trace.

Records (msgpack arrays, `protocol.trace` names the kinds) carry the event time first; message
events carry the ids they are found by (UNIQ_KEY, offset msg ids, KEYS words), queue events the
(topic, queue_id) and the queue offsets they cover, resolved against a message at query time:
- SENT: a message stored by SEND_MESSAGE / SEND_BATCH_MESSAGE (a resend from the DLQ too);
- BACK: CONSUMER_SEND_MSG_BACK stored a retry (or DLQ) copy; DLQ: POP sent an unacked one to the DLQ;
- PULLED: a pull returned [from, next) of a queue; COMMITTED: a group's offset moved (old, new];
- POPPED, ACKED, CHANGED, REVIVED: POP hand-outs, acks, invisible-time changes and revivals."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from time import time
from typing import Any

from broker.remoting.context import RequestContext
from protocol.channel import Channel
from protocol.message import PROPERTY_KEYS, PROPERTY_UNIQ_KEY, msg_id_prefix
from protocol.trace import (
    ACKED,
    BACK,
    CHANGED,
    COMMITTED,
    DLQ,
    NOTED_PROPERTIES,
    POPPED,
    PULLED,
    REVIVED,
    SENT,
)

ClientIdOf = Callable[[Channel], "str | None"]


class TraceRecorder:
    """One per broker; event-loop thread only. `store_host` is the broker's address (its offset msg
    ids); `client_id_of` names the client of a connection (its heartbeat's client id)."""

    def __init__(self, store_host: str, client_id_of: ClientIdOf, max_events: int) -> None:
        self._queue: deque[tuple[Any, ...]] = deque()
        self._max = max_events
        self._prefix = msg_id_prefix(store_host)
        self._client_id_of = client_id_of
        self.dropped = 0            # events not recorded: the queue was full
        self.recorded = 0           # events drained into records

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _add(self, event: tuple[Any, ...]) -> None:
        queue = self._queue
        if len(queue) < self._max:
            queue.append(event)
        else:
            self.dropped += 1

    # -- the request paths (one call per event) ---------------------------------------------------

    def sent(self, ctx: RequestContext, group: str, topic: str, queue_id: int, queue_offset: int,
             commit_log_offset: int, properties: dict[str, str]) -> None:
        """SEND_MESSAGE stored one message (`properties` as stored; not copied, not changed after)."""
        self._add((SENT, time(), ctx.channel, ctx.client_addr, group, topic, queue_id, queue_offset,
                   commit_log_offset, properties))

    def sent_batch(self, ctx: RequestContext, group: str, topic: str, queue_id: int, queue_offset: int,
                   commit_log_offsets: list[int], items: list[tuple[dict[str, str], int, bytes]]) -> None:
        """SEND_BATCH_MESSAGE stored `items` at consecutive queue offsets from `queue_offset`."""
        self._add((SENT + "*", time(), ctx.channel, ctx.client_addr, group, topic, queue_id, queue_offset,
                   commit_log_offsets, items))

    def sent_back(self, ctx: RequestContext, group: str, origin_commit_log_offset: int, delay_level: int,
                  to_dlq: bool, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int,
                  properties: dict[str, str]) -> None:
        """CONSUMER_SEND_MSG_BACK stored the copy at (`topic`, `queue_id`, `queue_offset`)."""
        self._add((BACK, time(), ctx.channel, ctx.client_addr, group, origin_commit_log_offset, delay_level,
                   to_dlq, topic, queue_id, queue_offset, commit_log_offset, properties))

    def pop_dlq(self, group: str, topic: str, queue_id: int, queue_offset: int, dlq_topic: str,
                dlq_queue_id: int, dlq_queue_offset: int, commit_log_offset: int, properties: dict[str, str]) -> None:
        """POP moved a message never acknowledged to the group's DLQ."""
        self._add((DLQ, time(), group, topic, queue_id, queue_offset, dlq_topic, dlq_queue_id, dlq_queue_offset,
                   commit_log_offset, properties))

    def pulled(self, channel: Channel, group: str, topic: str, queue_id: int, from_offset: int,
               next_offset: int, count: int) -> None:
        """A pull returned `count` messages of [from_offset, next_offset) (fewer: a filter skipped some)."""
        self._add((PULLED, time(), channel, group, topic, queue_id, from_offset, next_offset, count))

    def committed(self, client_addr: str, group: str, topic: str, queue_id: int, old_offset: int | None,
                  new_offset: int) -> None:
        """The group's committed offset of the queue moved from `old_offset` (None: none yet)."""
        self._add((COMMITTED, time(), client_addr, group, topic, queue_id, old_offset, new_offset))

    def popped(self, group: str, topic: str, queue_id: int, queue_offsets: list[int], deadline_ms: int) -> None:
        self._add((POPPED, time(), group, topic, queue_id, queue_offsets, deadline_ms))

    def acked(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None:
        self._add((ACKED, time(), group, topic, queue_id, queue_offset))

    def changed(self, group: str, topic: str, queue_id: int, queue_offset: int, deadline_ms: int) -> None:
        self._add((CHANGED, time(), group, topic, queue_id, queue_offset, deadline_ms))

    def revived(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None:
        self._add((REVIVED, time(), group, topic, queue_id, queue_offset))

    # -- off the request paths -------------------------------------------------------------------

    def drain(self) -> list[list[Any]]:
        """The waiting events as trace records (oldest first); the queue is empty after."""
        queue, self._queue = self._queue, deque()
        records = [record for event in queue for record in self._records(event)]
        self.recorded += len(records)
        return records

    def _client(self, channel: Channel) -> str:
        return self._client_id_of(channel) or ""

    def _records(self, event: tuple[Any, ...]) -> Iterator[list[Any]]:
        kind, at_ms = event[0], int(event[1] * 1000)
        if kind == SENT:
            _, _, channel, addr, group, topic, queue_id, queue_offset, offset, properties = event
            yield [SENT, at_ms, self._ids(properties, offset), topic, queue_id, queue_offset, offset, group,
                   self._client(channel), addr, _noted(properties)]
        elif kind == SENT + "*":
            _, _, channel, addr, group, topic, queue_id, queue_offset, offsets, items = event
            client = self._client(channel)
            for i, (offset, (properties, _flag, _body)) in enumerate(zip(offsets, items, strict=False)):
                yield [SENT, at_ms, self._ids(properties, offset), topic, queue_id, queue_offset + i, offset,
                       group, client, addr, _noted(properties)]
        elif kind == BACK:
            (_, _, channel, addr, group, origin_offset, delay_level, to_dlq, topic, queue_id, queue_offset,
             offset, properties) = event
            ids = self._ids(properties, offset)
            ids.append(self._prefix + f"{origin_offset:016X}")
            yield [BACK, at_ms, ids, group, self._client(channel), addr, delay_level, to_dlq, topic, queue_id,
                   queue_offset, offset, _noted(properties)]
        elif kind == DLQ:
            (_, _, group, topic, queue_id, queue_offset, dlq_topic, dlq_queue_id, dlq_queue_offset, offset,
             properties) = event
            yield [DLQ, at_ms, self._ids(properties, offset), group, topic, queue_id, queue_offset, dlq_topic,
                   dlq_queue_id, dlq_queue_offset, offset, _noted(properties)]
        elif kind == PULLED:
            _, _, channel, group, topic, queue_id, from_offset, next_offset, count = event
            yield [PULLED, at_ms, topic, queue_id, from_offset, next_offset, group, self._client(channel),
                   channel.remote_address, count]
        elif kind == COMMITTED:
            _, _, addr, group, topic, queue_id, old_offset, new_offset = event
            yield [COMMITTED, at_ms, topic, queue_id, old_offset, new_offset, group, addr]
        elif kind == POPPED:
            _, _, group, topic, queue_id, queue_offsets, deadline_ms = event
            yield [POPPED, at_ms, topic, queue_id, list(queue_offsets), group, deadline_ms]
        else:       # ACKED, CHANGED, REVIVED: (group, topic, queue_id, queue_offset[, deadline_ms])
            yield [kind, at_ms, event[3], event[4], event[5], event[2], *event[6:]]

    def _ids(self, properties: dict[str, str], commit_log_offset: int) -> list[str]:
        """What a message is found by: its offset msg id, its UNIQ_KEY ("" when it has none), its
        KEYS words, and, for a copy (retry, DLQ, resend), the ids of the message it copies."""
        ids = [self._prefix + f"{commit_log_offset:016X}", properties.get(PROPERTY_UNIQ_KEY) or ""]
        keys = properties.get(PROPERTY_KEYS)
        if keys:
            ids += keys.split()
        for name in NOTED_PROPERTIES[:2]:           # ORIGIN_MESSAGE_ID, DLQ_RESENT_FROM
            value = properties.get(name)
            if value:
                ids.append(value)
        return ids


def _noted(properties: dict[str, str]) -> dict[str, str] | None:
    noted = {name: properties[name] for name in NOTED_PROPERTIES if name in properties}
    return noted or None
