"""What the message and DLQ pages show and do: message search (by id, by key, by topic and store
time range), a message's body preview as text, JSON and hex, and the dead-letter list and resend,
through the admin commands' own functions (`admin.message`, `admin.dlq`), so the page and
`rocketq admin message query` / `dlq list` agree. Errors as `console.cluster_data`."""

from __future__ import annotations

import json
from typing import Any

from admin.cluster import on_each_broker
from admin.common import CommandError
from admin.dlq import list_dead_letters, resend_dead_letters
from admin.message import find_by_id
from admin.trace import gather_trace
from client.admin_api import AdminAPI
from protocol.codes import PullSysFlag
from protocol.errors import NoPermission, QueryNotFound, TopicNotExist
from protocol.headers import PullMessageRequestHeader
from protocol.message import MessageExt
from protocol.model import ExpressionType, PullStatus
from protocol.topics import dlq_topic
from protocol.trace import describe

TOOLS_CONSUMER = "TOOLS_CONSUMER"
MAX_RESULTS = 64            # the most messages one search shows (the broker's most per QUERY_MESSAGE)
PREVIEW_BYTES = 64 * 1024   # the most body bytes a preview shows


def summary(message: MessageExt) -> dict[str, Any]:
    """A search result row: ids, topic, queue, offsets, tags, keys, store time (epoch ms), size."""
    return {"msg_id": message.msg_id, "uniq_key": message.uniq_key or "", "topic": message.topic,
            "queue_id": message.queue_id, "queue_offset": message.queue_offset, "tags": message.tags or "",
            "keys": message.keys or "", "store_timestamp": message.store_timestamp,
            "born_host": message.born_host, "store_host": message.store_host,
            "reconsume_times": message.reconsume_times, "body_bytes": len(message.body)}


def body_preview(body: bytes) -> dict[str, Any]:
    """The first `PREVIEW_BYTES` of `body` as `text` (None when not UTF-8), `json` (pretty, None
    when not JSON), `hex` (16 bytes a line: offset, hex, printable ASCII) and `truncated`. Pure."""
    shown = body[:PREVIEW_BYTES]
    try:
        text: str | None = shown.decode()
    except UnicodeDecodeError:
        text = None
    pretty: str | None = None
    if text is not None and len(body) <= PREVIEW_BYTES:
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
        except ValueError:
            pretty = None
    lines = []
    for start in range(0, len(shown), 16):
        chunk = shown[start:start + 16]
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {chunk.hex(' '):<47}  {printable}")
    return {"text": text, "json": pretty, "hex": "\n".join(lines), "truncated": len(body) > PREVIEW_BYTES,
            "size": len(body)}


async def trace(api: AdminAPI, endpoint: str, msg_id: str) -> tuple[list[dict[str, Any]], str]:
    """The trace timeline of the message with `msg_id` (its UNIQ_KEY, so that its retry, DLQ and
    resent copies are in it, or an offset msg id) across the cluster, as `rocketq admin message
    trace` shows it (`admin.trace.gather_trace`), each entry with `where` ("topic:queue@offset"),
    and "" or why there is none: a user without Get on Cluster (NO_PERMISSION) still sees the
    message. Other errors raise as `console.cluster_data`'s."""
    try:
        timeline = await gather_trace(api, endpoint, msg_id=msg_id, max_entries=500)
    except NoPermission as exc:
        return [], f"the trace needs Get on Cluster: {exc.remark}"
    for entry in timeline:
        entry["where"] = describe(entry)
    return timeline, ""


async def by_key(api: AdminAPI, endpoint: str, topic: str, key: str) -> list[MessageExt]:
    """Messages of `topic` with `key` among their KEYS (or as UNIQ_KEY) on every broker of the
    topic, newest first; [] when none (QUERY_MESSAGE, as `admin message query --key`)."""
    async def query(address: str) -> list[MessageExt]:
        try:
            return await api.query_message(address, topic, key, MAX_RESULTS)
        except QueryNotFound:
            return []
    found = await on_each_broker(api, endpoint, query, topic=topic)
    messages = [m for batch in found.values() for m in batch]
    return sorted(messages, key=lambda m: m.store_timestamp, reverse=True)[:MAX_RESULTS]


async def by_id(api: AdminAPI, endpoint: str, msg_id: str, topic: str | None) -> list[MessageExt]:
    """`admin message query --id` on each broker (offset message id, else with `topic` UNIQ_KEY);
    [] when no broker has it."""
    async def query(address: str) -> list[MessageExt]:
        try:
            return await find_by_id(api, address, msg_id, topic)
        except (CommandError, TopicNotExist):
            return []
    found = await on_each_broker(api, endpoint, query, topic=topic)
    return [m for batch in found.values() for m in batch]


async def by_time(api: AdminAPI, endpoint: str, topic: str, begin_ms: int, end_ms: int) -> list[MessageExt]:
    """Messages of `topic` stored in [`begin_ms`, `end_ms`] (epoch ms), oldest first, at most
    `MAX_RESULTS`: per queue from the offset SEARCH_OFFSET_BY_TIMESTAMP finds, read like a consumer
    (group `TOOLS_CONSUMER`, nothing committed)."""
    async def read(address: str) -> list[MessageExt]:
        stats = await api.get_topic_stats(address, topic)
        found: list[MessageExt] = []
        for queue in stats.offset_table:
            queue_offset = await api.search_offset(address, topic, queue.queue_id, begin_ms)
            header = PullMessageRequestHeader(
                consumer_group=TOOLS_CONSUMER, topic=topic, queue_id=queue.queue_id, queue_offset=queue_offset,
                max_msg_nums=MAX_RESULTS, sys_flag=PullSysFlag.SUBSCRIPTION, commit_offset=0,
                suspend_timeout_ms=0, sub_version=0, subscription="*", expression_type=ExpressionType.TAG)
            result = await api.pull_message(address, header, 5_000)
            if result.status is PullStatus.FOUND:
                found += [m for m in result.messages if begin_ms <= m.store_timestamp <= end_ms]
        return found
    answers = await on_each_broker(api, endpoint, read, topic=topic)
    messages = sorted((m for batch in answers.values() for m in batch), key=lambda m: m.store_timestamp)
    return messages[:MAX_RESULTS]


async def dead_letters(api: AdminAPI, endpoint: str, group: str, limit: int = 200) -> dict[str, Any]:
    """`dlq list --json` of the group, each row with its `broker` address: `{"topic", "stored",
    "rows"}` (`stored`: messages held in the DLQ on every broker)."""
    found = await list_dead_letters(api, endpoint, group, limit)
    rows = [{"broker": answer.address, **row} for answer in found.answers for row in answer.value[1]]
    stored = sum(letters.max_offset - letters.min_offset for letters, _ in found.values())
    return {"topic": dlq_topic(group), "stored": stored, "rows": rows}


async def resend(api: AdminAPI, endpoint: str, group: str, msg_id: str | None) -> list[dict[str, Any]]:
    """`dlq resend --msg-id` (found on whichever broker holds it) or, with `msg_id` None,
    `dlq resend --all` on every broker of the DLQ topic. Raises `CommandError` as those."""
    rows: list[dict[str, Any]] = []
    found = await list_dead_letters(api, endpoint, group, 1)
    addresses = [answer.address for answer in found.answers]
    if msg_id is None:
        for address in addresses:
            rows += await resend_dead_letters(api, address, group, None)
        return rows
    failure: CommandError | None = None
    for address in addresses:
        try:
            return await resend_dead_letters(api, address, group, msg_id)
        except CommandError as exc:
            failure = exc
    raise failure or CommandError(f"no message {msg_id!r} in {dlq_topic(group)}")
