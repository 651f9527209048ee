"""QUERY_MESSAGE_TRACE (rocketq's, docs/protocol.md): the trace of a message on this broker.

1. The message records (SENT, BACK, DLQ) whose ids include the msg id or key are read from the
   trace segments (in a worker thread; the waiting events are written first, so a query sees every
   event recorded before it).
2. Its copies are found: where each record stored one, and, through the store's key index, the
   retry messages the schedule service stored in `%RETRY%<group>` after a send-back (they keep the
   UNIQ_KEY, as RocketMQ's do) and the DLQ copies; an offset msg id of this broker is also read
   from the commit log directly, so a message stored with the trace off still has its place.
3. The queue records that cover a copy's (topic, queue_id, queue_offset) are read (only segments
   whose summary covers it) and resolved: a pull that returned it is a delivery, the first commit
   of a group past it its consumption, POP records of its offset its pops, acks and revivals.
One query runs at a time (others wait); a query answers at most `max_entries` entries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgpack

from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.topics.system_topics import NOT_ALLOWED_SEND_TOPICS
from broker.topics.topic_config_manager import TopicConfigManager
from broker.trace.resolver import Entry, Resolver
from broker.trace.segments import find_message_records, find_queue_records, matches
from broker.trace.service import TraceService
from protocol.command import RemotingCommand
from protocol.errors import SystemError_
from protocol.message import (
    F_PROPERTIES,
    F_STORE_TIMESTAMP,
    F_TOPIC,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
    msg_id_prefix,
    parse_msg_id,
)
from protocol.topics import TRANS_HALF_TOPIC, dlq_topic, retry_topic
from protocol.trace import (
    BACK,
    HALF,
    MAX_QUERY_CHARS,
    MAX_TRACE_ENTRIES,
    SENT,
    QueryMessageTraceRequestHeader,
    as_properties,
    merge_timeline,
)

_KEY_INDEX_MATCHES = 64


def check_query(header: QueryMessageTraceRequestHeader) -> str:
    """The msg id or key asked for; raises `SystemError_` naming what is wrong (both or neither
    given, a value over `MAX_QUERY_CHARS`, `max_entries` outside 1..`MAX_TRACE_ENTRIES`)."""
    if bool(header.msg_id) == bool(header.key):
        raise SystemError_("give exactly one of msg_id or key")
    for name in ("msg_id", "key", "topic"):
        value = getattr(header, name)
        if len(value) > MAX_QUERY_CHARS:
            raise SystemError_(f"{name} is {len(value)} characters long: at most {MAX_QUERY_CHARS}")
    if not 1 <= header.max_entries <= MAX_TRACE_ENTRIES:
        raise SystemError_(f"max_entries {header.max_entries} is outside 1..{MAX_TRACE_ENTRIES}")
    return header.msg_id or header.key


class TraceQueryProcessor:
    def __init__(self, service: Callable[[], TraceService | None], store: MessageStore, topics: TopicConfigManager,
                 broker_address: str) -> None:
        self._service, self._store, self._topics, self._address = service, store, topics, broker_address
        self._prefix = msg_id_prefix(broker_address)
        self._lock = asyncio.Lock()

    async def query(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """SUCCESS with a msgpack array of timeline entries (`protocol.trace`), oldest first (as
        `merge_timeline` orders them), [] when nothing is
        known (also with the trace off); SYSTEM_ERROR for a malformed query (`check_query`)."""
        header = QueryMessageTraceRequestHeader.from_fields(request.fields)
        wanted = check_query(header)
        service = self._service()
        async with self._lock:
            entries = await self._trace(service, wanted, header.topic, header.max_entries)
        return request.response(body=msgpack.packb(merge_timeline([entries])[:header.max_entries]))

    async def _trace(self, service: TraceService | None, wanted: str, topic: str, limit: int) -> list[Entry]:
        if service is not None:
            await service.flush()                 # the query sees every event recorded before it
        clients = service.segments.client_ids() if service is not None else {}
        resolver = Resolver(self._address, limit, self._store_time, clients)
        commit_log_offset = self._offset_of(wanted)
        fields = None
        if commit_log_offset is not None:          # an offset msg id of this broker: read the message
            fields = self._store.look_message_fields(commit_log_offset)
            if fields is not None and (not topic or fields[F_TOPIC] == topic):
                uniq_key = fields[F_PROPERTIES].get(PROPERTY_UNIQ_KEY)
                if uniq_key:                       # its records are found by it, and its copies too
                    wanted, commit_log_offset = uniq_key, None
        records: list[list[Any]] = []
        if service is not None:
            views = service.segments.snapshot()
            records = await asyncio.to_thread(find_message_records, views, wanted, limit, commit_log_offset)
        if topic:
            records = [r for r in records if topic in _topics_of(r)]
        for record in records:
            resolver.message_record(record)
        if fields is not None and (not topic or fields[F_TOPIC] == topic):
            resolver.stored_message(fields)        # stored with the trace off (or its records dropped)
        if commit_log_offset is None:
            self._stored(resolver, wanted, topic)
        self._copies(resolver, topic)
        if service is not None and resolver.locations:
            wanted_offsets: dict[tuple[str, int], set[int]] = {}
            for queue_topic, queue_id, queue_offset in resolver.locations:
                wanted_offsets.setdefault((queue_topic, queue_id), set()).add(queue_offset)
            views = service.segments.snapshot()
            queue_records = await asyncio.to_thread(find_queue_records, views, wanted_offsets, limit * 4)
            for record in queue_records:
                resolver.queue_record(record)
        return resolver.entries

    def _store_time(self, commit_log_offset: int) -> int | None:
        fields = self._store.look_message_fields(commit_log_offset)
        return None if fields is None else int(fields[F_STORE_TIMESTAMP])

    def _offset_of(self, wanted: str) -> int | None:
        """The commit-log offset of an offset msg id of this broker; None for anything else."""
        if len(wanted) != 32 or not wanted.upper().startswith(self._prefix):
            return None
        try:
            return parse_msg_id(wanted.upper())[1]
        except ValueError:
            return None

    def _stored(self, resolver: Resolver, wanted: str, topic: str) -> None:
        """The stored messages found by `wanted` in the store's key index, in `topic` or in every
        topic of this broker (a message sent in a batch, whose send is recorded per batch, is
        found this way; so is one whose SENT record was dropped)."""
        names = [topic] if topic else sorted(t.topic for t in self._topics.topics())
        for payload in self._store.query_by_key(TRANS_HALF_TOPIC, wanted, _KEY_INDEX_MATCHES):
            fields = msgpack.unpackb(payload, raw=False)      # a half message (sent in a batch: no record)
            properties = fields[F_PROPERTIES]
            if matches(properties, wanted) and (not topic or properties.get(PROPERTY_REAL_TOPIC) == topic):
                resolver.half_message(fields)
        for name in names:
            if resolver.full:
                return
            if name in NOT_ALLOWED_SEND_TOPICS or name.startswith("rmq_sys_"):   # a delayed copy, a half message
                continue
            for payload in self._store.query_by_key(name, wanted, _KEY_INDEX_MATCHES):
                fields = msgpack.unpackb(payload, raw=False)
                if matches(fields[F_PROPERTIES], wanted):
                    resolver.stored_message(fields)

    def _copies(self, resolver: Resolver, topic: str) -> None:
        """The stored copies of the messages found so far (retry messages the schedule service
        stored, DLQ copies, the original when only a copy was found), by UNIQ_KEY in the key index."""
        topics = set(resolver.topics) | ({topic} if topic else set())
        for group in resolver.groups:
            topics |= {retry_topic(group), dlq_topic(group)}
        for uniq_key in sorted(resolver.uniq_keys):
            if resolver.full:
                return
            for name in sorted(topics):
                for payload in self._store.query_by_key(name, uniq_key, _KEY_INDEX_MATCHES):
                    fields = msgpack.unpackb(payload, raw=False)
                    if fields[F_PROPERTIES].get(PROPERTY_UNIQ_KEY) == uniq_key:
                        resolver.stored_message(fields)


def _topics_of(record: list[Any]) -> set[str]:
    """The topics a message record concerns (its copy's, the one it was retried from)."""
    kind, properties = record[0], as_properties(record[-1])
    topics = {record[4]} if kind in (SENT, HALF) else {record[7]} if kind == BACK else {record[3], record[6]}
    if isinstance(properties, dict) and PROPERTY_RETRY_TOPIC in properties:
        topics.add(properties[PROPERTY_RETRY_TOPIC])
    return topics
