"""`TraceRecorder`: the request paths' side of the message trace. Each event is one tuple appended
to a bounded deque (the processors call one method per event; nothing is looked up, encoded or
written there); `drain` hands what waited to `TraceService` to write. Past `queue_max_events`
waiting events new ones are dropped and counted (`dropped`), so a send or a pull never waits for
the trace.

Records are the event tuples themselves, written by msgpack as arrays with no conversion: the
kind (`protocol.trace`'s letter), the time (epoch seconds, a float), then the event's fields.
A client is recorded by its connection's "ip:port"; the client id a connection heartbeats with is
recorded once per connection (CLIENT), so a query names the client without a lookup per event.
Message records end with the stored message's `protocol.trace.NOTED` properties (what a query
matches a msg id or key against: UNIQ_KEY, KEYS, DLQ_RESENT_FROM, ORIGIN_MESSAGE_ID; and
RETRY_TOPIC), as strings: no dict of the request is held until the write; queue records carry (topic, queue_id)
and the queue offsets they cover at positions 2 to 4, resolved against a message's place at query
time:
- SENT: a message stored by SEND_MESSAGE's typed path (a delayed or timer message, a retry topic's,
  a first send to a queue, ...), with its noted properties;
- SENT_SET: the usual single sends (SEND_MESSAGE's fast path, a resend from the DLQ too) of one
  client and producer group to one queue since the last write, as a queue record: the queue
  offsets, in order ([SENT_SET, time, topic, queue_id, [offsets], group, client]). A send costs an
  append to a list (a SENT record per send cost ~0.5 µs to make and ~0.5 µs to write: 5-8 % of a
  single send's broker CPU); the message itself is found at query time through the commit log (an
  offset msg id) or the store's key index (a UNIQ_KEY or key), as a batched one, and its
  properties (a DLQ resend's DLQ_RESENT_FROM) read there;
- SENT_BATCH_SET: the SEND_BATCH_MESSAGEs of one client and producer group to one queue since the
  last write, as a queue record: each batch's [first, next) queue offsets and its time, three items
  a batch in one flat list ([SENT_BATCH_SET, time, topic, queue_id, [first, next, time, first, ...],
  group, client]); nothing per message (a batched message is found through the store's key index at
  query time; its own properties are in the store). A SENT_BATCH record per batch (older trace
  files: [SENT_BATCH, time, topic, queue_id, first, next, group, client]) cost ~2 µs to make and
  write, ~1.5 % of a batch of 32;
- BACK: CONSUMER_SEND_MSG_BACK stored a retry (or DLQ) copy; DLQ: POP sent an unacked one to the DLQ;
- PULLED_SET: the pulls of one client and consumer group from one queue since the last write, as a
  queue record: each pull's [from, next) queue offsets, the messages it returned (fewer: a filter
  skipped some) and its time, four items a pull in one flat list ([PULLED_SET, time, topic,
  queue_id, [from, next, count, time, from, next, ...], group, client]). A PULLED record per pull
  (what older trace files hold: [PULLED, time, topic, queue_id, from, next, group, client, count])
  cost ~1.2 µs to write against ~0.1 here: a consumer pulling one message at a time paid it per
  message;
- COMMITTED: a group's offset moved old -> new;
- POPPED, ACKED, CHANGED, REVIVED: POP hand-outs, acks, invisible-time changes and revivals;
- HALF: a transactional SEND_MESSAGE stored a half message (a message record; its place is the
  half queue's offset); HALF_BATCH: the halves of a transactional SEND_BATCH_MESSAGE, as a queue
  record of RMQ_SYS_TRANS_HALF_TOPIC queue 0 ([first, next) half offsets, then the group, the
  client and the real topic and queue: one record per batch, a half found through the store's key
  index at query time); TRANSACTION: a half's check-back or outcome (a queue record of the half
  queue at the half's offset); COMMITTED_RUN: the halves one END_TRANSACTION_BATCH committed into
  one queue by one append ([half offsets], topic, queue_id, the first queue offset). A HALF and a
  TRANSACTION record per message made the trace ~25 % of the broker's CPU in transactional sends.
"""

from __future__ import annotations

from collections import deque
from time import time
from typing import Any

from broker.remoting.context import RequestContext
from broker.store.results import PutMessageResult
from broker.trace.sets import SetsBase
from protocol.topics import TRANS_HALF_TOPIC
from protocol.trace import (
    ACKED,
    BACK,
    CHANGED,
    CLIENT,
    COMMITTED_RUN,
    DLQ,
    HALF,
    HALF_BATCH,
    NOTED,
    POPPED,
    PULLED_SET,
    REVIVED,
    SENT,
    SENT_BATCH_SET,
    SENT_SET,
    TRANSACTION,
    noted,
)

_UNIQ, _KEYS, _RESENT_FROM, _ORIGIN, _RETRY_TOPIC = NOTED


class TraceRecorder(SetsBase):
    """One per broker; event-loop thread only. The per-message calls (`sent_usual`, `pulled`,
    `committed`) are `SetsBase`'s (in C when built)."""

    def __init__(self, max_events: int) -> None:
        self._queue: deque[tuple[Any, ...]] = deque()
        self._commits: dict[tuple[str, str, int], list[Any]] = {}     # (group, topic, queue_id) -> its COMMITTED
        self._sent_sets: dict[tuple[str, int, str, str], list[Any]] = {}  # (topic, queue_id, group, client) -> offsets
        self._pulled_sets: dict[tuple[str, int, str, str], list[Any]] = {}   # the same key -> pulls
        self._batch_sets: dict[tuple[str, int, str, str], list[Any]] = {}    # the same key -> batches
        self._in_sets = 0           # sends, pulls and batches in the sets (counted against `max_events`)
        self._max = max_events
        self.dropped = 0            # events not recorded: the queue was full
        self.recorded = 0           # events drained into records (each send, pull and batch of a set counted)

    @property
    def waiting(self) -> int:
        return len(self._queue) + self._in_sets

    def _add(self, event: tuple[Any, ...]) -> None:
        queue = self._queue
        if len(queue) < self._max:
            queue.append(event)
        else:
            self.dropped += 1

    # -- the request paths (one call per event) ---------------------------------------------------

    def sent(self, ctx: RequestContext, group: str, topic: str, queue_id: int, queue_offset: int,
             commit_log_offset: int, properties: dict[str, str]) -> None:
        """SEND_MESSAGE stored one message (`properties` as stored; not copied, not changed after);
        `queue_offset` -1: a delayed message, whose place is known once it is delivered."""
        queue = self._queue
        if len(queue) < self._max:
            get = properties.get        # `NOTED`, inline: this runs for every send
            queue.append((SENT, time(), ctx.client_addr, group, topic, queue_id, queue_offset, commit_log_offset,
                          (get(_UNIQ), get(_KEYS), get(_RESENT_FROM), get(_ORIGIN), get(_RETRY_TOPIC))))
        else:
            self.dropped += 1

    def sent_batch(self, ctx: RequestContext, group: str, topic: str, queue_id: int, queue_offset: int,
                   count: int) -> None:
        """SEND_BATCH_MESSAGE stored `count` messages at queue offsets `queue_offset`.. (three items of
        a SENT_BATCH_SET record: per message, a batch costs the broker ~3 µs, which a record each
        would add a third to)."""
        if len(self._queue) + self._in_sets >= self._max:
            self.dropped += 1
            return
        self._in_sets += 1
        key = (topic, queue_id, group, ctx.client_addr)
        batches = self._batch_sets.get(key)
        if batches is None:
            self._batch_sets[key] = [queue_offset, queue_offset + count, time()]
        else:
            batches += (queue_offset, queue_offset + count, time())

    def sent_back(self, ctx: RequestContext, group: str, origin_commit_log_offset: int, delay_level: int,
                  to_dlq: bool, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int,
                  properties: dict[str, str]) -> None:
        """CONSUMER_SEND_MSG_BACK stored the copy at (`topic`, `queue_id`, `queue_offset`)."""
        self._add((BACK, time(), ctx.client_addr, group, origin_commit_log_offset, delay_level, to_dlq, topic,
                   queue_id, queue_offset, commit_log_offset, noted(properties)))

    def pop_dlq(self, group: str, topic: str, queue_id: int, queue_offset: int, dlq_topic: str,
                dlq_queue_id: int, dlq_queue_offset: int, commit_log_offset: int, properties: dict[str, str]) -> None:
        """POP moved a message never acknowledged to the group's DLQ."""
        self._add((DLQ, time(), group, topic, queue_id, queue_offset, dlq_topic, dlq_queue_id, dlq_queue_offset,
                   commit_log_offset, noted(properties)))

    def popped(self, group: str, topic: str, queue_id: int, queue_offsets: list[int], deadline_ms: int) -> None:
        self._add((POPPED, time(), topic, queue_id, queue_offsets, group, deadline_ms))

    def acked(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None:
        self._add((ACKED, time(), topic, queue_id, queue_offset, group))

    def changed(self, group: str, topic: str, queue_id: int, queue_offset: int, deadline_ms: int) -> None:
        self._add((CHANGED, time(), topic, queue_id, queue_offset, group, deadline_ms))

    def revived(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None:
        self._add((REVIVED, time(), topic, queue_id, queue_offset, group))

    def sent_half(self, client_addr: str, group: str, topic: str, queue_id: int, half_offset: int,
                  commit_log_offset: int, properties: dict[str, str]) -> None:
        """A transactional send stored a half message for (`topic`, `queue_id`), held at
        `half_offset` of the half queue until committed or rolled back."""
        self._add((HALF, time(), client_addr, group, topic, queue_id, half_offset, commit_log_offset,
                   noted(properties)))

    def sent_halves(self, client_addr: str, group: str, topic: str, queue_id: int, result: PutMessageResult,
                    count: int) -> None:
        """The `count` half messages a transactional SEND_BATCH_MESSAGE stored (`result`: its put,
        consecutive half offsets from `result.queue_offset`), for `topic`:`queue_id`: one
        HALF_BATCH queue record, nothing per message (a half is found through the store's key index
        at query time, as a batched send's message)."""
        if count > 0:
            self._add((HALF_BATCH, time(), TRANS_HALF_TOPIC, 0, result.queue_offset, result.queue_offset + count,
                       group, client_addr, topic, queue_id))

    def transaction(self, half_offset: int, outcome: str, info: Any) -> None:
        """The half at `half_offset`: `outcome` one of `protocol.trace.TRANSACTION_EVENTS`;
        `info` for "committed" [topic, queue_id, queue_offset] of the message written, for
        "checked_back" and "half_dropped" the check-backs sent so far, else None."""
        self._add((TRANSACTION, time(), TRANS_HALF_TOPIC, 0, half_offset, outcome, info))

    def committed_run(self, half_offsets: list[int], topic: str, queue_id: int, first_queue_offset: int) -> None:
        """Halves whose messages were written as one append from `first_queue_offset`, in order (the
        i-th at `first_queue_offset + i`): one COMMITTED_RUN queue record (what a "committed"
        TRANSACTION record of each would say)."""
        if half_offsets:
            self._add((COMMITTED_RUN, time(), TRANS_HALF_TOPIC, 0, half_offsets, topic, queue_id, first_queue_offset))

    def client(self, client_addr: str, client_id: str) -> None:
        """The connection from `client_addr` heartbeats as `client_id` (once per connection and id)."""
        self._add((CLIENT, time(), client_addr, client_id))

    # -- off the request paths -------------------------------------------------------------------

    def drain(self) -> list[Any]:
        """The waiting events as trace records (the event tuples themselves), oldest first; the
        queue is empty after."""
        queue, self._queue = self._queue, deque()
        records: list[Any] = list(queue)
        self.recorded += len(records) + self._in_sets + len(self._commits)
        self._in_sets = 0
        if self._sent_sets:
            records += _set_records(SENT_SET, self._sent_sets)
            self._sent_sets = {}
        if self._pulled_sets:
            records += _set_records(PULLED_SET, self._pulled_sets)
            self._pulled_sets = {}
        if self._batch_sets:
            records += _set_records(SENT_BATCH_SET, self._batch_sets)
            self._batch_sets = {}
        if self._commits:
            records += self._commits.values()
            self._commits = {}
        return records


def _set_records(kind: str, sets: dict[tuple[str, int, str, str], list[Any]]) -> list[tuple[Any, ...]]:
    """One queue record of `kind` per (topic, queue_id, group, client) of `sets`, at this time."""
    now = time()
    return [(kind, now, topic, queue_id, items, group, client)
            for (topic, queue_id, group, client), items in sets.items()]
