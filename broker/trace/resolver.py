"""`Resolver`: the timeline entries of one trace query (broker/trace/query.py), from the message
records and stored copies found first (their places collected), then the queue records covering
those places (`protocol.trace` names each record's items)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.message import (
    F_COMMIT_LOG_OFFSET,
    F_PROPERTIES,
    F_QUEUE_ID,
    F_QUEUE_OFFSET,
    F_RECONSUME_TIMES,
    F_STORE_TIMESTAMP,
    F_TOPIC,
    PROPERTY_DLQ_RESENT_FROM,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
    make_msg_id,
)
from protocol.topics import TRANS_HALF_TOPIC
from protocol.trace import (
    ACKED,
    BACK,
    CHANGED,
    COMMITTED,
    COMMITTED_RUN,
    HALF,
    HALF_BATCH,
    POPPED,
    PULLED,
    PULLED_SET,
    REVIVED,
    SENT,
    SENT_BATCH,
    SENT_BATCH_SET,
    SENT_SET,
    TRANSACTION,
    as_properties,
)

TOOLS_CONSUMER = "TOOLS_CONSUMER"           # the admin's own reads: not deliveries
Location = tuple[str, int, int]             # (topic, queue_id, queue_offset)
Entry = dict[str, Any]


def _identity(place: Entry) -> Entry:
    """What names a message in its entries: msg_id, uniq_key, topic and queue_id."""
    return {k: place[k] for k in ("msg_id", "uniq_key", "topic", "queue_id") if k in place}


class Resolver:
    """Builds the entries of one query: message records and stored copies first (their locations
    collected), then the queue records covering those locations."""

    def __init__(self, address: str, limit: int, store_time: Callable[[int], int | None],
                 clients: dict[str, str]) -> None:
        self.address, self._limit, self._store_time, self._clients = address, limit, store_time, clients
        self.entries: list[Entry] = []
        self.locations: dict[Location, Entry] = {}      # a copy's place -> its identity (msg_id, uniq_key)
        self.uniq_keys: set[str] = set()
        self.topics: set[str] = set()
        self.groups: set[str] = set()
        self._consumed: set[tuple[str, Location]] = set()
        self._sent_back: set[tuple[str, str]] = set()     # (group, msg_id) of copies a group sent back
        self._stored_us: dict[Location, int] = {}         # a place's store time (epoch µs)
        self._resent_from: dict[Location, str] = {}       # a stored copy's DLQ_RESENT_FROM (a resend)

    @property
    def full(self) -> bool:
        """Whether the query's `max_entries` are reached (nothing more is looked up)."""
        return len(self.entries) >= self._limit

    def _add(self, event: str, at_us: int, **fields: Any) -> None:
        if len(self.entries) < self._limit:
            self.entries.append({"at_ms": at_us // 1000, "at_us": at_us, "event": event, "broker": self.address,
                                 **{k: v for k, v in fields.items() if v is not None and v != ""}})

    def _place(self, topic: str, queue_id: int, queue_offset: int, msg_id: str, uniq_key: str | None) -> Entry:
        identity = {"msg_id": msg_id, "uniq_key": uniq_key, "topic": topic, "queue_id": queue_id,
                    "queue_offset": queue_offset}
        self.locations.setdefault((topic, queue_id, queue_offset), identity)
        self.topics.add(topic)
        if uniq_key:
            self.uniq_keys.add(uniq_key)
        return identity

    def message_record(self, record: list[Any]) -> None:
        kind, at_us, properties = record[0], int(record[1] * 1_000_000), as_properties(record[-1])
        uniq = properties.get(PROPERTY_UNIQ_KEY) or None
        if kind == SENT:
            _, _, addr, group, topic, queue_id, queue_offset, offset, _ = record
            client_id = self._clients.get(addr)
            stored_ms = self._store_time(offset)      # recorded after the put: a delivery may come first
            at_us = stored_ms * 1000 if stored_ms else at_us
            msg_id = make_msg_id(self.address, offset)
            if queue_offset < 0:        # delayed (DELAY level or timer): its place is known once delivered
                place = {"msg_id": msg_id, "uniq_key": uniq, "topic": topic, "queue_id": queue_id}
                self.topics.add(topic)
                if uniq:
                    self.uniq_keys.add(uniq)
            else:
                place = self._place(topic, queue_id, queue_offset, msg_id, uniq)
            resent_from = properties.get(PROPERTY_DLQ_RESENT_FROM)
            event = "resent_from_dlq" if resent_from else "sent"
            detail = f"copy of DLQ message {resent_from}" if resent_from else f"producer group {group}"
            self._add(event, at_us, **place, group=group, client_id=client_id, client_addr=addr, detail=detail)
            self._add("stored", at_us, **place, detail=f"commit-log offset {offset}")
        elif kind == BACK:
            _, _, addr, group, origin_offset, delay_level, to_dlq, topic, queue_id, queue_offset, offset, _ = record
            client_id = self._clients.get(addr)
            self.groups.add(group)
            origin, copy_id = make_msg_id(self.address, origin_offset), make_msg_id(self.address, offset)
            self._sent_back.add((group, origin))
            if uniq:
                self.uniq_keys.add(uniq)
            if to_dlq:
                place = self._place(topic, queue_id, queue_offset, copy_id, uniq)
                self._add("sent_back", at_us, msg_id=origin, uniq_key=uniq, group=group, client_id=client_id,
                          client_addr=addr, detail=f"consumption failed: to the DLQ as {copy_id}")
                self._add("to_dlq", at_us, **place, group=group, detail=f"commit-log offset {offset}")
            else:
                self._add("sent_back", at_us, msg_id=origin, uniq_key=uniq, group=group, client_id=client_id,
                          client_addr=addr, detail=f"consumption failed: retry {copy_id} at delay level {delay_level}")
        elif kind == HALF:
            self._half(record, at_us, uniq)
        else:       # DLQ: POP gave up on it
            _, _, group, topic, queue_id, queue_offset, dlq, dlq_queue_id, dlq_queue_offset, offset, _ = record
            self.groups.add(group)
            place = self._place(dlq, dlq_queue_id, dlq_queue_offset, make_msg_id(self.address, offset), uniq)
            self._add("to_dlq", at_us, **place, group=group,
                      detail=f"not acknowledged: moved from {topic}:{queue_id}@{queue_offset}")

    def _half(self, record: list[Any], at_us: int, uniq: str | None) -> None:
        """A transactional send's half message: "sent_half"; its place in the half queue is kept
        (its TRANSACTION records are found there), the real topic searched for the committed copy."""
        _, _, addr, group, topic, queue_id, half_offset, offset, _ = record
        stored_ms = self._store_time(offset)
        msg_id = make_msg_id(self.address, offset)
        self.locations.setdefault((TRANS_HALF_TOPIC, 0, half_offset),
                                  {"msg_id": msg_id, "uniq_key": uniq, "topic": topic, "queue_id": queue_id})
        self.topics.add(topic)
        if uniq:
            self.uniq_keys.add(uniq)
        self._add("sent_half", stored_ms * 1000 if stored_ms else at_us, msg_id=msg_id, uniq_key=uniq, topic=topic,
                  queue_id=queue_id, group=group, client_id=self._clients.get(addr), client_addr=addr,
                  detail=f"producer group {group}: a half message, held at {TRANS_HALF_TOPIC}:0@{half_offset} "
                         f"until committed or rolled back")

    def half_message(self, fields: list[Any]) -> None:
        """A half message found in the store (one sent in a batch has no message record: its
        HALF_BATCH queue record is found at its place): its place in the half queue is kept, as
        `_half` keeps it, unless known already."""
        location = (TRANS_HALF_TOPIC, 0, fields[F_QUEUE_OFFSET])
        if location in self.locations:
            return
        properties = fields[F_PROPERTIES]
        uniq, topic = properties.get(PROPERTY_UNIQ_KEY) or None, properties.get(PROPERTY_REAL_TOPIC, "")
        try:
            queue_id = int(properties.get(PROPERTY_REAL_QUEUE_ID, -1))
        except ValueError:
            queue_id = -1
        self.locations[location] = {"msg_id": make_msg_id(self.address, fields[F_COMMIT_LOG_OFFSET]),
                                    "uniq_key": uniq, "topic": topic, "queue_id": queue_id}
        self._stored_us[location] = fields[F_STORE_TIMESTAMP] * 1000
        self.topics.add(topic)
        if uniq:
            self.uniq_keys.add(uniq)

    def _half_batch(self, record: list[Any], at_us: int, half_offset: int, place: Entry) -> None:
        """A HALF_BATCH record covering a half found: its "sent_half", as `_half` adds it."""
        from_offset, next_offset, group, addr = record[4:8]
        if from_offset <= half_offset < next_offset:
            self._add("sent_half", self._stored_us.get((TRANS_HALF_TOPIC, 0, half_offset), at_us), **place,
                      group=group, client_id=self._clients.get(addr), client_addr=addr,
                      detail=f"producer group {group}: a half message, held at {TRANS_HALF_TOPIC}:0@{half_offset} "
                             f"until committed or rolled back")

    def _committed(self, at_us: int, identity: Entry, info: list[Any]) -> None:
        stored_us = self._stored_us.get((info[0], info[1], info[2]))   # the commit is recorded after its put
        self._add("committed", min(at_us, stored_us) if stored_us else at_us, **identity,
                  detail=f"committed: written to {info[0]}:{info[1]}@{info[2]}")

    def _transaction(self, record: list[Any], at_us: int, place: Entry) -> None:
        """A TRANSACTION record of a half found: its check-back or outcome."""
        outcome, info = record[5], record[6]
        identity = _identity(place)
        if outcome == "committed" and isinstance(info, list) and len(info) == 3:
            self._committed(at_us, identity, info)
        elif outcome == "rolled_back":
            self._add("rolled_back", at_us, **identity, detail="rolled back: never delivered")
        elif outcome == "checked_back":     # at its millisecond: a commit it brings is placed by its store time (ms)
            self._add("checked_back", at_us // 1000 * 1000, **identity,
                      detail=f"check-back {info}: the producer group was asked for the outcome")
        elif outcome == "half_dropped":
            self._add("half_dropped", at_us, **identity,
                      detail=f"dropped after {info} check-backs (transaction_check_max): never delivered")

    def stored_message(self, fields: list[Any]) -> None:
        """A copy found in the store (a retry message the schedule service stored, a DLQ copy, or the
        message itself): a "retry_stored" / "stored" entry unless its place is known already."""
        if fields[F_TOPIC] == TRANS_HALF_TOPIC:
            self.half_message(fields)
            return
        location = (fields[F_TOPIC], fields[F_QUEUE_ID], fields[F_QUEUE_OFFSET])
        if location in self.locations:
            return
        self._stored_us[location] = fields[F_STORE_TIMESTAMP] * 1000
        properties = fields[F_PROPERTIES]
        if PROPERTY_DLQ_RESENT_FROM in properties:
            self._resent_from[location] = properties[PROPERTY_DLQ_RESENT_FROM]
        msg_id = make_msg_id(self.address, fields[F_COMMIT_LOG_OFFSET])
        place = self._place(*location, msg_id, properties.get(PROPERTY_UNIQ_KEY))
        topic = location[0]
        if topic.startswith("%RETRY%"):
            self._add("retry_stored", fields[F_STORE_TIMESTAMP] * 1000, **place,
                      detail=f"retry {fields[F_RECONSUME_TIMES]} of {properties.get(PROPERTY_RETRY_TOPIC, '?')}")
        elif topic.startswith("%DLQ%"):
            self._add("to_dlq", fields[F_STORE_TIMESTAMP] * 1000, **place, detail="in the dead-letter queue")
        else:
            self._add("stored", fields[F_STORE_TIMESTAMP] * 1000, **place,
                      detail=f"commit-log offset {fields[F_COMMIT_LOG_OFFSET]}")

    def _batch_sent(self, at_us: int, location: tuple[str, int, int], place: dict[str, Any], group: str, addr: str,
                    from_offset: int, next_offset: int) -> None:
        at = self._stored_us.get(location, at_us)
        self._add("sent", at, **place, group=group, client_id=self._clients.get(addr), client_addr=addr,
                  detail=f"producer group {group}, in a batch of {next_offset - from_offset}")

    def _delivered(self, at_us: int, place: dict[str, Any], group: str, addr: str, from_offset: int,
                   next_offset: int, count: int) -> None:
        filtered = count < next_offset - from_offset
        self._add("delivered", at_us, **place, group=group, client_id=self._clients.get(addr), client_addr=addr,
                  detail="by pull" + (" (a filtered pull: if it matched the filter)" if filtered else ""))

    def queue_record(self, record: list[Any]) -> None:
        kind, at_us, topic, queue_id = record[0], int(record[1] * 1_000_000), record[2], record[3]
        for (place_topic, place_queue_id, queue_offset), place in self.locations.items():
            if place_topic != topic or place_queue_id != queue_id:
                continue
            location = (topic, queue_id, queue_offset)
            if kind == SENT_BATCH_SET:
                batches, group, addr = record[4:7]
                for i in range(0, len(batches) - 2, 3):
                    if batches[i] <= queue_offset < batches[i + 1]:
                        self._batch_sent(int(batches[i + 2] * 1_000_000), location, place, group, addr,
                                         *batches[i:i + 2])
            elif kind == SENT_BATCH:    # (a trace file written before SENT_BATCH_SET)
                from_offset, next_offset, group, addr = record[4:8]
                if from_offset <= queue_offset < next_offset:
                    self._batch_sent(at_us, location, place, group, addr, from_offset, next_offset)
            elif kind == SENT_SET:
                offsets, group, addr = record[4:7]
                if queue_offset in offsets:
                    resent_from = self._resent_from.get(location)
                    self._add("resent_from_dlq" if resent_from else "sent", self._stored_us.get(location, at_us),
                              **place, group=group, client_id=self._clients.get(addr), client_addr=addr,
                              detail=f"copy of DLQ message {resent_from}" if resent_from else f"producer group {group}")
            elif kind == PULLED_SET:
                pulls, group, addr = record[4:7]
                if group == TOOLS_CONSUMER:
                    continue
                for i in range(0, len(pulls) - 3, 4):
                    if pulls[i] <= queue_offset < pulls[i + 1]:
                        self._delivered(int(pulls[i + 3] * 1_000_000), place, group, addr, *pulls[i:i + 3])
            elif kind == PULLED:        # (a trace file written before PULLED_SET)
                from_offset, next_offset, group, addr, count = record[4:9]
                if from_offset <= queue_offset < next_offset and group != TOOLS_CONSUMER:
                    self._delivered(at_us, place, group, addr, from_offset, next_offset, count)
            elif kind == COMMITTED and not topic.startswith("%DLQ%"):   # there: `dlq resend --all`'s mark
                old, new, group, addr = record[4:8]
                key = (group, (topic, queue_id, queue_offset))
                if ((old is None or old <= queue_offset) and queue_offset < new and key not in self._consumed
                        and (group, place["msg_id"]) not in self._sent_back):   # its outcome: the send-back
                    self._consumed.add(key)
                    self._add("consumed", at_us, **place, group=group, client_addr=addr,
                              detail=f"the group's committed offset moved to {new}")
            elif kind == HALF_BATCH:
                self._half_batch(record, at_us, queue_offset, place)
            elif kind == COMMITTED_RUN:
                half_offsets, real_topic, real_queue_id, first = record[4:8]
                if queue_offset in half_offsets:
                    self._committed(at_us, _identity(place),
                                    [real_topic, real_queue_id, first + half_offsets.index(queue_offset)])
            elif kind == POPPED:
                if queue_offset in record[4]:
                    self._add("popped", at_us, **place, group=record[5],
                              detail=f"by pop, invisible until {record[6]} (epoch ms)")
            elif record[4] == queue_offset:
                group = record[5]
                if kind == TRANSACTION:
                    self._transaction(record, at_us, place)
                elif kind == ACKED:
                    self._add("acked", at_us, **place, group=group, detail="POP acknowledged")
                elif kind == CHANGED:
                    self._add("invisible_changed", at_us, **place, group=group,
                              detail=f"invisible until {record[6]} (epoch ms)")
                elif kind == REVIVED:
                    self._add("revived", at_us, **place, group=group, detail="not acknowledged in time: visible again")
