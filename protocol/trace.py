"""Message trace on the wire (QUERY_MESSAGE_TRACE, docs/protocol.md) and the timeline both the
admin CLI and the console show. Pure: no I/O.

A broker answers a trace query with a msgpack array of *entries*, one map per thing that happened
to the message (and to its retry, DLQ and resent copies) on that broker:

    {"at_ms": int (epoch ms), "at_us": int (epoch µs, the order), "event": str (one of EVENTS),
     "broker": str (its address),
     "msg_id": str (offset msg id of the copy concerned), "uniq_key": str, "topic": str,
     "queue_id": int, "queue_offset": int, "group": str, "client_id": str, "client_addr": str,
     "detail": str}

(keys that do not apply are absent). `merge_timeline` joins the answers of every broker of a
cluster into one timeline, oldest first. RocketMQ's trace (a trace topic written by client hooks)
has the same shape of events: Pub, SubBefore/SubAfter, EndTransaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from protocol.headers import Header, Int32, header
from protocol.message import (
    PROPERTY_DLQ_RESENT_FROM,
    PROPERTY_KEYS,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
)

# Record kinds (the first item of a trace record on disk).
SENT, BACK, DLQ = "S", "B", "D"                                              # message records
PULLED, COMMITTED, POPPED, ACKED, CHANGED, REVIVED = "P", "C", "O", "A", "I", "R"   # queue records
SENT_BATCH = "M"                                                             # a queue record too
SENT_SET = "N"                  # a queue record: the usual single sends of one client to one queue
PULLED_SET = "L"                # a queue record: the pulls of one client and group from one queue
SENT_BATCH_SET = "K"            # a queue record: the batch sends of one client and group to one queue
CLIENT = "H"                                                                 # a connection's client id
HALF = "T"                      # a message record: a transactional send stored its half message
TRANSACTION = "E"               # a queue record of the half queue: a half's check-back or outcome
HALF_BATCH = "U"                # a queue record of the half queue: the halves of a transactional batch send
COMMITTED_RUN = "W"             # a queue record of the half queue: halves committed by one append
MESSAGE_KINDS = frozenset((SENT, BACK, DLQ, HALF))
OTHER_KINDS = frozenset((SENT, BACK, DLQ, CLIENT, HALF))    # records that cover no queue offsets

# Timeline events, in the order they are listed when two have the same time. A transactional
# message: "sent_half" (held in the half queue), any "checked_back", then "committed" (and its
# "stored" in the real topic), "rolled_back" or "half_dropped" (after transaction_check_max).
EVENTS = ("sent", "sent_half", "resent_from_dlq", "checked_back", "committed", "rolled_back", "half_dropped",
          "stored", "retry_stored", "popped", "delivered", "invisible_changed", "revived", "acked", "sent_back",
          "to_dlq", "consumed")
# What a TRANSACTION record's outcome is (its sixth item), one of these EVENTS.
TRANSACTION_EVENTS = ("checked_back", "committed", "rolled_back", "half_dropped")
_RANK = {name: rank for rank, name in enumerate(EVENTS)}

# The properties a message record keeps (not the message's dict: one held per event until it is
# written made the garbage collector's full passes more frequent), in this order.
NOTED = (PROPERTY_UNIQ_KEY, PROPERTY_KEYS, PROPERTY_DLQ_RESENT_FROM, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC)

MAX_QUERY_CHARS = 512           # a msg id or key longer than this is refused
MAX_TRACE_ENTRIES = 10_000      # most entries one broker answers


@header
class QueryMessageTraceRequestHeader(Header):
    """QUERY_MESSAGE_TRACE: the trace of the messages whose msg id (UNIQ_KEY or offset msg id) is
    `msg_id`, or, when `msg_id` is empty, that carry `key` among their KEYS; `topic` (optional)
    keeps only messages of that topic (or retried from it). At most `max_entries` entries."""

    msg_id: str = ""
    key: str = ""
    topic: str = ""
    max_entries: Int32 = 1_000


def noted(properties: Mapping[str, str]) -> tuple[str | None, ...]:
    """The `NOTED` properties of a message, None where it has none (`NOTED`'s names spelled out:
    a generator cost twice as much, once per traced message)."""
    get = properties.get
    return (get(PROPERTY_UNIQ_KEY), get(PROPERTY_KEYS), get(PROPERTY_DLQ_RESENT_FROM), get(PROPERTY_ORIGIN_MESSAGE_ID),
            get(PROPERTY_RETRY_TOPIC))


def as_properties(values: Any) -> dict[str, str]:
    """The properties `noted` kept (a record read back), as a dict of those it had."""
    if not isinstance(values, list | tuple):
        return {}
    return {name: value for name, value in zip(NOTED, values, strict=False) if isinstance(value, str) and value}


def entry_key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two entries the same (a broker asked twice, by msg id then by UNIQ_KEY)."""
    return (entry.get("broker"), entry.get("event"), entry.get("at_ms"), entry.get("msg_id"),
            entry.get("group"), entry.get("topic"), entry.get("queue_id"), entry.get("queue_offset"))


def merge_timeline(answers: Iterable[Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One timeline from the brokers' answers: duplicates dropped (`entry_key`), sorted by time
    (`at_us`, else `at_ms`), then by broker (the broker with the earliest entry first, else the
    one that appears first in `answers`: one broker's entries of an instant stay together), then
    by `EVENTS` order (a send before its store, a delivery before its commit), then as they came.
    Entries with an unknown event sort last at their time. Merging a merged timeline again keeps
    its order (`gather_trace` feeds the first round's timeline back with the second round's)."""
    seen: set[tuple[Any, ...]] = set()
    first: dict[Any, tuple[int, int]] = {}      # broker -> (its earliest time, its first appearance)
    found: list[tuple[int, Any, int, dict[str, Any]]] = []
    for answer in answers:
        for entry in answer:
            key = entry_key(entry)
            if key not in seen:
                seen.add(key)
                at_us, broker = entry.get("at_us", entry.get("at_ms", 0) * 1000), entry.get("broker")
                earliest, appearance = first.get(broker, (at_us, len(first)))
                first[broker] = (min(earliest, at_us), appearance)
                found.append((at_us, broker, _RANK.get(entry.get("event", ""), len(EVENTS)), dict(entry)))
    # at one time (store times have ms precision), one broker's entries stay together
    found.sort(key=lambda r: (r[0], first[r[1]], r[2]))
    return [entry for *_, entry in found]


def uniq_keys(entries: Iterable[Mapping[str, Any]]) -> set[str]:
    """The UNIQ_KEYs of the messages in `entries` (to ask every broker for their copies)."""
    return {e["uniq_key"] for e in entries if e.get("uniq_key")}


def describe(entry: Mapping[str, Any]) -> str:
    """One line for `entry`'s place: "orders:1@42" (topic, queue, queue offset) when it has one."""
    if "topic" not in entry:
        return ""
    where = f"{entry['topic']}"
    if "queue_id" in entry:
        where += f":{entry['queue_id']}"
    if "queue_offset" in entry:
        where += f"@{entry['queue_offset']}"
    return where
