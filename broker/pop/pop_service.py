"""`PopService`: the broker's POP state (every (group, topic, queue)'s `QueuePopState`), kept durable
by a `PopJournal`, and the revive loop (RocketMQ `PopReviveService`): every `pop_revive_interval_ms`
in-flight messages past their invisible deadline become visible again with `reconsume_times + 1`, or,
past the group's `retry_max_times`, are copied to `%DLQ%<group>` and forgotten. Every change is
journaled before it is applied; a snapshot every `persist_interval_ms` and at stop bounds replay.

Held pops (`wait_change`) are woken by arrivals through the hold service and by this service
whenever a queue of their (group, topic) gets something to hand out: a revive, an ack (FIFO: the
queue unblocks), a DLQ."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from broker.pop.journal import PopJournal, revive_topic
from broker.pop.state import InFlight, QueuePopState, ReviveDecision, revive_decision
from broker.processors.send_message import check_put
from broker.store.message_store import MessageStore
from broker.store.results import GetMessageStatus
from broker.topics.retry_topics import RetryTopics
from broker.trace.recorder import TraceRecorder
from protocol.message import (
    F_BODY,
    F_BORN_HOST,
    F_BORN_TIMESTAMP,
    F_COMMIT_LOG_OFFSET,
    F_FLAG,
    F_PROPERTIES,
    F_SYS_FLAG,
    F_TOPIC,
    PROPERTY_DLQ_REASON,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    make_msg_id,
)
from protocol.service import Service

log = logging.getLogger(__name__)

QueueKey = tuple[str, str, int]         # (group, topic, queue_id)
_NONE_IN_FLIGHT: dict[int, InFlight] = {}   # (read only) the in-flight entries of a queue with no state
DlqCounter = Callable[[str], None]


class PopService(Service):
    name = "pop-revive"

    def __init__(self, store: MessageStore, journal: PopJournal, retry_topics: RetryTopics, now_ms: Callable[[], int],
                 *, revive_interval_ms: int, persist_interval_ms: int, max_in_flight: int, store_host: str,
                 on_dlq: DlqCounter) -> None:
        super().__init__()
        self._store, self._journal, self._retry = store, journal, retry_topics
        self.now_ms = now_ms
        self._revive_interval_ms, self._persist_interval_ms = revive_interval_ms, persist_interval_ms
        self.max_in_flight = max_in_flight
        self._store_host, self._on_dlq = store_host, on_dlq
        self.queues: dict[QueueKey, QueuePopState] = {}
        self.next_ck_id = 1
        self._waiters: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        self.dlq_count = 0
        self.trace: TraceRecorder | None = None     # the message trace (set by the broker when on)

    # -- load / persist --------------------------------------------------------------------------

    def load(self) -> None:
        """The snapshot, then every journal record after it (call after the store recovered)."""
        covered, self.next_ck_id, queues = self._journal.load_snapshot()
        for group, topic, queue_id, value in queues:
            self.queues[(group, topic, queue_id)] = QueuePopState.from_json(value)
        replayed = 0
        for record in self._journal.replay(covered):
            self._apply(record)
            replayed += 1
        if replayed or queues:
            log.info("pop state: %d queues from the snapshot, %d journal records replayed", len(queues), replayed)

    def snapshot(self) -> tuple[int, int, list[Any]]:
        """The state with the journal offset it covers, taken in one loop step (consistent)."""
        queues = [[g, t, q, s.to_json()] for (g, t, q), s in self.queues.items()]
        return self._journal.end_offset, self.next_ck_id, queues

    def persist(self) -> None:
        self._journal.write_snapshot(*self.snapshot())

    def _apply(self, record: list[Any]) -> None:
        kind, group, topic, queue_id = record[0], record[1], record[2], record[3]
        key = (group, topic, queue_id)
        if kind == "init":
            self.queues.setdefault(key, QueuePopState(record[4]))
            return
        if kind == "acks":
            for queue_id, ck_id, queue_offset in record[4]:
                acked = self.queues.get((group, topic, queue_id))
                if acked is not None:
                    acked.ack(queue_offset, ck_id)
            return
        state = self.queues.get(key)
        if state is None:
            state = self.queues[key] = QueuePopState(0)
        if kind == "ck":
            ck_id, deadline_ms, next_offset, offsets = record[4], record[5], record[6], record[7]
            state.hand_out([(o, r) for o, r in offsets], ck_id, deadline_ms, next_offset)
            self.next_ck_id = max(self.next_ck_id, ck_id + 1)
        elif kind == "ack":
            state.ack(record[5], record[4])

        elif kind == "chg":
            state.change(record[5], record[4], record[6], record[7])
            self.next_ck_id = max(self.next_ck_id, record[6] + 1)

    # -- changes (journal first, then state) -----------------------------------------------------

    def state(self, group: str, topic: str, queue_id: int, initial_offset: int) -> QueuePopState:
        """The queue's state, created (and journaled) at `initial_offset` on first use."""
        key = (group, topic, queue_id)
        state = self.queues.get(key)
        if state is None:
            next_offset = initial_offset
            self._journal.append(["init", group, topic, queue_id, next_offset])
            state = self.queues[key] = QueuePopState(next_offset)
        return state

    def find(self, group: str, topic: str, queue_id: int) -> QueuePopState | None:
        return self.queues.get((group, topic, queue_id))

    def hand_out(self, group: str, topic: str, queue_id: int, offsets: list[tuple[int, int]],
                 deadline_ms: int, next_offset: int) -> int:
        """Journal and record a pop; returns its ck_id."""
        state = self.queues[(group, topic, queue_id)]
        ck_id = self.next_ck_id
        if offsets or next_offset > state.next_offset:
            self._journal.append(["ck", group, topic, queue_id, ck_id, deadline_ms, next_offset, offsets])
            self.next_ck_id += 1
        state.hand_out(offsets, ck_id, deadline_ms, next_offset)
        if self.trace is not None and offsets:
            self.trace.popped(group, topic, queue_id, [o for o, _ in offsets], deadline_ms)
        return ck_id

    def ack(self, group: str, topic: str, queue_id: int, queue_offset: int, ck_id: int) -> bool:
        state = self.queues.get((group, topic, queue_id))
        if state is None or state.current(queue_offset, ck_id) is None:
            return False
        self._journal.append(["ack", group, topic, queue_id, ck_id, queue_offset])
        state.ack(queue_offset, ck_id)
        self.notify(group, topic)
        if self.trace is not None:
            self.trace.acked(group, topic, queue_id, queue_offset)
        return True

    def ack_batch(self, group: str, topic: str, acks: list[tuple[int, int, int]]) -> list[bool]:
        """Acknowledge several (queue_id, ck_id, queue_offset) of one (group, topic) with one
        journal record; per ack, whether its handle was current (a stale one changes nothing; the
        same handle twice: the second is stale). The entries are taken out as they are checked and
        put back if the journal refuses the record (nothing awaits in between: no one sees them
        gone), so a refused batch changes nothing, as a journal-first change."""
        current: list[bool] = []
        valid: list[tuple[int, int, int]] = []
        taken: list[tuple[dict[int, InFlight], int, InFlight]] = []
        queues, last_queue_id, in_flight = self.queues, -1, _NONE_IN_FLIGHT
        for ack in acks:
            queue_id, ck_id, queue_offset = ack
            if queue_id != last_queue_id:
                state = queues.get((group, topic, queue_id))
                last_queue_id, in_flight = queue_id, state.in_flight if state is not None else _NONE_IN_FLIGHT
            entry = in_flight.pop(queue_offset, None)
            if entry is not None and entry.ck_id == ck_id:
                current.append(True)
                valid.append(ack)
                taken.append((in_flight, queue_offset, entry))
                continue
            if entry is not None:
                in_flight[queue_offset] = entry
            current.append(False)
        if valid:
            try:
                self._journal.append(["acks", group, topic, -1, valid])
            except BaseException:
                for in_flight, queue_offset, entry in taken:
                    in_flight[queue_offset] = entry
                raise
            if self.trace is not None:
                for queue_id, _ck_id, queue_offset in valid:
                    self.trace.acked(group, topic, queue_id, queue_offset)
            self.notify(group, topic)
        return current

    def change(self, group: str, topic: str, queue_id: int, queue_offset: int, ck_id: int,
               deadline_ms: int) -> int | None:
        """The new ck_id, or None for a stale handle."""
        state = self.queues.get((group, topic, queue_id))
        if state is None or state.current(queue_offset, ck_id) is None:
            return None
        new_ck_id = self.next_ck_id
        self._journal.append(["chg", group, topic, queue_id, ck_id, queue_offset, new_ck_id, deadline_ms])
        self.next_ck_id += 1
        state.change(queue_offset, ck_id, new_ck_id, deadline_ms)
        if self.trace is not None:
            self.trace.changed(group, topic, queue_id, queue_offset, deadline_ms)
        return new_ck_id

    # -- held pops ------------------------------------------------------------------------------

    def waiter(self, group: str, topic: str) -> asyncio.Future[None]:
        """A future resolved at the next `notify(group, topic)`; the caller discards it with
        `forget` when done."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((group, topic), set()).add(future)
        return future

    def forget(self, group: str, topic: str, future: asyncio.Future[None]) -> None:
        waiters = self._waiters.get((group, topic))
        if waiters is not None:
            waiters.discard(future)
            if not waiters:
                del self._waiters[(group, topic)]

    def notify(self, group: str, topic: str) -> None:
        for future in self._waiters.pop((group, topic), ()):
            if not future.done():
                future.set_result(None)

    def release_all(self) -> None:
        for key in list(self._waiters):
            self.notify(*key)

    # -- revive ---------------------------------------------------------------------------------

    async def run(self) -> None:
        since_persist = 0
        while await self.wait(self._revive_interval_ms):
            try:
                self.revive_due()
            except Exception:   # a full disk: try again next round
                log.exception("pop revive failed")
            since_persist += self._revive_interval_ms
            if since_persist >= self._persist_interval_ms:
                try:
                    await asyncio.to_thread(self._journal.write_snapshot, *self.snapshot())
                except OSError as exc:   # a full disk: the journal still holds it all; tried next round
                    log.warning("pop: snapshot not written (%s); retrying", exc)
                    continue
                since_persist = 0

    async def stop(self) -> None:
        self.release_all()
        await super().stop()
        if self.queues or self._journal.end_offset:
            self.persist()

    def revive_due(self) -> int:
        """Revive (or DLQ) every expired in-flight message; returns how many."""
        now_ms, count = self.now_ms(), 0
        for (group, topic, queue_id), state in list(self.queues.items()):
            expired = state.expired(now_ms)
            if not expired:
                continue
            retry_max_times = self._retry.retry_max_times(group)
            try:
                for queue_offset, entry in expired:
                    if revive_decision(entry.reconsume_times, retry_max_times) is ReviveDecision.DLQ:
                        self._to_dlq(group, topic, queue_id, queue_offset, entry.reconsume_times + 1)
                        self._journal.append(["ack", group, topic, queue_id, entry.ck_id, queue_offset])
                        state.drop(queue_offset, entry.ck_id)
                    else:
                        state.revive(queue_offset, entry.ck_id)
                        if self.trace is not None:
                            self.trace.revived(group, topic, queue_id, queue_offset)
                    count += 1
            except BaseException:
                state.earliest_ms = 0        # the rest is still due: look again next round
                raise
            finally:
                self.notify(group, topic)
        return count

    def forward_to_dlq(self, group: str, topic: str, queue_id: int, queue_offset: int, ck_id: int,
                       delivery_attempt: int) -> bool:
        """The consumer gives up on a delivery (the gRPC API's ForwardMessageToDeadLetterQueue): when
        its handle (`ck_id`) is current it is acked and the message copied to `%DLQ%<group>` (reason:
        `delivery_attempt` deliveries); False (nothing done) when the handle is stale."""
        if not self.ack(group, topic, queue_id, queue_offset, ck_id):
            return False
        self._to_dlq(group, topic, queue_id, queue_offset, max(delivery_attempt, 1))
        return True

    def _to_dlq(self, group: str, topic: str, queue_id: int, queue_offset: int, reconsume_times: int) -> None:
        """Copy the message at `queue_offset` to `%DLQ%<group>` (nothing when it is gone: retention)."""
        result = self._store.get_message(topic, queue_id, queue_offset, 1, None)
        if result.status is not GetMessageStatus.FOUND or not result.messages:
            log.warning("pop: %s %s:%d@%d reached the DLQ but is no longer stored", group, topic, queue_id,
                        queue_offset)
            return
        fields = msgpack.unpackb(result.messages[0], raw=False)
        properties: dict[str, str] = dict(fields[F_PROPERTIES])
        properties.setdefault(PROPERTY_RETRY_TOPIC, fields[F_TOPIC])
        properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, make_msg_id(self._store_host, fields[F_COMMIT_LOG_OFFSET]))
        properties[PROPERTY_DLQ_REASON] = f"pop: not acknowledged after {reconsume_times} deliveries"
        dlq_topic, dlq_queue_id = self._retry.dlq_queue(group)
        stored = self._store.put_message(
            topic=dlq_topic, queue_id=dlq_queue_id, body=bytes(fields[F_BODY]), properties=properties,
            flag=fields[F_FLAG], born_timestamp=fields[F_BORN_TIMESTAMP], born_host=fields[F_BORN_HOST],
            reconsume_times=reconsume_times, sys_flag=fields[F_SYS_FLAG])
        check_put(stored)
        if self.trace is not None:
            self.trace.pop_dlq(group, topic, queue_id, queue_offset, dlq_topic, dlq_queue_id, stored.queue_offset,
                               stored.commit_log_offsets[0], properties)
        self.dlq_count += 1
        self._on_dlq(group)
        log.info("pop: group %s message %s:%d@%d sent to %s after %d deliveries", group, topic, queue_id,
                 queue_offset, dlq_topic, reconsume_times)


def build_pop_service(store: MessageStore, retry_topics: RetryTopics, now_ms: Callable[[], int], *,
                      cluster_name: str, config_dir: Path, max_in_flight: int, revive_interval_ms: int,
                      persist_interval_ms: int, store_host: str, on_dlq: DlqCounter) -> PopService:
    """A `PopService` journaling to `rmq_sys_REVIVE_LOG_<cluster_name>` with its snapshot in
    `config_dir`, its state loaded (the store must be started)."""
    journal = PopJournal(store, revive_topic(cluster_name), config_dir / "pop_state.msgpack", store_host)
    service = PopService(store, journal, retry_topics, now_ms, revive_interval_ms=revive_interval_ms,
                         persist_interval_ms=persist_interval_ms, max_in_flight=max_in_flight,
                         store_host=store_host, on_dlq=on_dlq)
    service.load()
    return service
