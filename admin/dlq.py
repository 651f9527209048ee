"""`rocketq admin dlq list|resend --group G`: inspect a group's dead-letter queue and send its
messages back to their original topics (REFERENCE.md §9; RocketMQ's console "resend").

The DLQ is `%DLQ%<group>`, one queue. A message there keeps its original topic in `RETRY_TOPIC`,
its first message id in `ORIGIN_MESSAGE_ID`, and why the broker put it there in `DLQ_REASON`
(`list` shows it in its "why" column). `resend` sends a copy to the original topic with
`reconsume_times` reset to 0 and the broker-side properties (`RETRY_TOPIC`, `REAL_TOPIC`,
`REAL_QID`, `DELAY`, `MAX_RECONSUME_TIMES`, `DLQ_REASON`) removed, so the group consumes it as new.

`resend --all` resends from the group's resend mark (its committed offset on the DLQ topic) to the
end and then moves the mark, so running it twice resends nothing twice. `resend --msg-id` resends
one message and leaves the mark alone. The copy carries `DLQ_RESENT_FROM` (the DLQ message's id),
so a message resent before is found in the broker's key index (`earlier_copy`): `resend` skips it
(`--msg-id` of it is refused) unless `--force`, and `list` marks it resent, as it does what is
before the mark."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import click

from admin.base import admin_group, example_epilog
from admin.cluster import BrokerAnswers, on_each_broker
from admin.common import EXIT_REFUSED, CommandError, command_options, emit, fail, run_admin
from client.admin_api import AdminAPI
from protocol.codes import PullSysFlag
from protocol.errors import QueryNotFound, TopicNotExist
from protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_DLQ_REASON,
    PROPERTY_DLQ_RESENT_FROM,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
    MessageExt,
)
from protocol.model import ExpressionType, PullStatus
from protocol.topics import dlq_topic

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
TOOLS_PRODUCER_GROUP = "TOOLS_PRODUCER"
PULL_BATCH = 32
BROKER_SIDE_PROPERTIES = frozenset({PROPERTY_RETRY_TOPIC, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
                                    PROPERTY_DELAY_TIME_LEVEL, PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_DLQ_REASON,
                                    "CONSUME_START_TIME", "MIN_OFFSET", "MAX_OFFSET"})
BODY_PREVIEW_BYTES = 40
MAX_QUERY_MESSAGES = 64             # the broker's most per QUERY_MESSAGE


@dataclass(slots=True)
class DeadLetters:
    """The DLQ's messages from `start` on, its offsets and the resend mark."""

    messages: list[MessageExt]
    min_offset: int
    max_offset: int
    resend_mark: int


async def read_dead_letters(api: AdminAPI, address: str, group: str, start: int | None,
                            limit: int) -> DeadLetters:
    """Up to `limit` messages of `%DLQ%<group>` from `start` (None: the resend mark, or the
    queue's min); an absent DLQ topic reads as empty."""
    topic = dlq_topic(group)
    try:
        max_offset = await api.get_max_offset(address, topic, 0)
        min_offset = await api.get_min_offset(address, topic, 0)
    except TopicNotExist:
        return DeadLetters([], 0, 0, 0)
    try:
        mark = await api.query_consumer_offset(address, group, topic, 0)
    except QueryNotFound:
        mark = min_offset
    queue_offset = max(mark if start is None else start, min_offset)
    messages: list[MessageExt] = []
    while queue_offset < max_offset and len(messages) < limit:
        header = PullMessageRequestHeader(
            consumer_group=TOOLS_CONSUMER_GROUP, topic=topic, queue_id=0, queue_offset=queue_offset,
            max_msg_nums=min(PULL_BATCH, limit - len(messages)), sys_flag=PullSysFlag.SUBSCRIPTION,
            commit_offset=0, suspend_timeout_ms=0, sub_version=0, subscription="*",
            expression_type=ExpressionType.TAG)
        result = await api.pull_message(address, header, timeout_ms=10_000)
        if result.status is PullStatus.FOUND:
            messages.extend(result.messages)
        if result.next_begin_offset <= queue_offset:
            break
        queue_offset = result.next_begin_offset
    return DeadLetters(messages[:limit], min_offset, max_offset, mark)


def resend_properties(message: MessageExt) -> dict[str, str]:
    """The copy's properties: the message's own without the broker-side ones; ORIGIN_MESSAGE_ID is
    kept (or set to the DLQ message's id) so the lineage stays traceable; DLQ_RESENT_FROM is the
    DLQ message's id and UNIQ_KEY is kept (or set to that id), so `earlier_copy` finds it. Pure."""
    properties = {k: v for k, v in message.properties.items() if k not in BROKER_SIDE_PROPERTIES}
    properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
    properties.setdefault(PROPERTY_UNIQ_KEY, message.msg_id)
    properties[PROPERTY_DLQ_RESENT_FROM] = message.msg_id
    return properties


async def earlier_copy(api: AdminAPI, address: str, message: MessageExt) -> MessageExt | None:
    """The newest copy `resend` made of the DLQ `message` before: looked up in the broker's key
    index under its original topic by the UNIQ_KEY the copy has (`resend_properties`), told
    apart from the original by its DLQ_RESENT_FROM; None when there is none (or the key index no
    longer holds it: it keeps the newest `key_index` entries, rebuilt from the commit log)."""
    topic = message.properties.get(PROPERTY_RETRY_TOPIC)
    if not topic:
        return None
    try:
        found = await api.query_message(address, topic, message.uniq_key or message.msg_id, MAX_QUERY_MESSAGES)
    except (QueryNotFound, TopicNotExist):
        return None
    return next((m for m in found if m.properties.get(PROPERTY_DLQ_RESENT_FROM) == message.msg_id), None)


async def resend(api: AdminAPI, address: str, message: MessageExt, sequence: int, *, force: bool) -> dict[str, Any]:
    """Send a copy of a DLQ `message` to its original topic (queue `sequence` modulo its write
    queues); returns the row printed for it. A message without RETRY_TOPIC is reported, not sent;
    so is one resent before (`earlier_copy`, its id in `resent_before_as`) unless `force`."""
    topic = message.properties.get(PROPERTY_RETRY_TOPIC, "")
    row: dict[str, Any] = {"dlq_offset": message.queue_offset, "dlq_msg_id": message.msg_id,
                           "origin_msg_id": message.properties.get(PROPERTY_ORIGIN_MESSAGE_ID, ""),
                           "topic": topic, "new_msg_id": "", "queue_id": "", "resent_before_as": ""}
    if not topic:
        row["new_msg_id"] = "skipped: no RETRY_TOPIC (original topic unknown)"
        return row
    copy = await earlier_copy(api, address, message)
    if copy is not None:
        row["resent_before_as"] = copy.msg_id
        if not force:
            row["new_msg_id"] = f"skipped: already resent as {copy.msg_id} (--force resends it again)"
            return row
    route = await api.get_route_info(address, topic)
    write_queues = max((q.write_queue_nums for q in route.queue_datas), default=1)
    header = SendMessageRequestHeader(producer_group=TOOLS_PRODUCER_GROUP, topic=topic,
                                      queue_id=sequence % max(write_queues, 1), flag=message.flag,
                                      born_timestamp=time.time_ns() // 1_000_000,
                                      properties=resend_properties(message), reconsume_times=0)
    result = await api.send_message(address, header, message.body)
    row.update(new_msg_id=result.msg_id, queue_id=result.queue_id)
    return row


def why(message: MessageExt) -> str:
    """Why `message` is in the DLQ: the DLQ_REASON the broker stamped ("failed 17 times (max
    reconsume times 16)", or "the consumer sent it to the DLQ (delay level -1)"); for a message
    stored without one, its reconsume times. Pure."""
    reason = message.properties.get(PROPERTY_DLQ_REASON)
    return reason or f"reconsume times {message.reconsume_times} (no {PROPERTY_DLQ_REASON})"


def _row(message: MessageExt, resent: bool) -> dict[str, Any]:
    body = message.body[:BODY_PREVIEW_BYTES]
    return {
        "dlq_offset": message.queue_offset, "msg_id": message.msg_id,
        "origin_msg_id": message.properties.get(PROPERTY_ORIGIN_MESSAGE_ID, ""),
        "topic": message.properties.get(PROPERTY_RETRY_TOPIC, ""), "why": why(message),
        "reconsume_times": message.reconsume_times,
        "stored_at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(message.store_timestamp / 1000)),
        "keys": message.keys or "", "tags": message.tags or "",
        "body": body.decode("utf-8", "replace") + ("…" if len(message.body) > BODY_PREVIEW_BYTES else ""),
        "resent": resent,
    }


async def _listed(api: AdminAPI, address: str, group: str, limit: int) -> tuple[DeadLetters, list[dict[str, Any]]]:
    """The DLQ's first `limit` messages as rows; resent: before the resend mark, or a copy found."""
    letters = await read_dead_letters(api, address, group, 0, limit)
    rows = [_row(m, m.queue_offset < letters.resend_mark or await earlier_copy(api, address, m) is not None)
            for m in letters.messages]
    return letters, rows


async def _resend_on_broker(api: AdminAPI, address: str, group: str, msg_id: str | None, *,
                            force: bool) -> list[dict[str, Any]]:
    """The rows `resend` gives for one broker's DLQ (`msg_id`'s copies, or all past the resend mark,
    which then moves to the DLQ's end); an unknown `msg_id` gives no rows."""
    resend_all = msg_id is None
    letters = await read_dead_letters(api, address, group, None if resend_all else 0, 1_000_000)
    chosen = letters.messages if resend_all else [
        m for m in letters.messages if msg_id in (m.msg_id, m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID))]
    rows = [await resend(api, address, m, i, force=force) for i, m in enumerate(chosen)]
    if resend_all and letters.max_offset > letters.resend_mark:
        await api.update_consumer_offset(address, group, dlq_topic(group), 0, letters.max_offset)
    return rows


def _refusal(group: str, msg_id: str | None, rows: list[dict[str, Any]]) -> str | None:
    """Why a resend of `msg_id` that gave `rows` is refused (unknown, or every copy resent before)."""
    if msg_id and not rows:
        return f"no message {msg_id!r} in {dlq_topic(group)}"
    if msg_id and all(row["queue_id"] == "" and row["resent_before_as"] for row in rows):
        copies = ", ".join(row["resent_before_as"] for row in rows)
        return (f"message {msg_id} of {dlq_topic(group)} was already resent (as {copies}); "
                "give --force to resend it again")
    return None


async def resend_dead_letters(api: AdminAPI, address: str, group: str, msg_id: str | None, *,
                              force: bool = False) -> list[dict[str, Any]]:
    """`dlq resend` on the broker at `address`: `msg_id` (a DLQ msg id or an ORIGIN_MESSAGE_ID) or,
    when None, every message after the resend mark, then the mark moves to the DLQ's end. Returns
    a row per message (`resend`); raises `CommandError` for an unknown `msg_id` or, unless
    `force`, one resent before (the console's resend buttons call this too)."""
    rows = await _resend_on_broker(api, address, group, msg_id, force=force)
    refusal = _refusal(group, msg_id, rows)
    if refusal:
        raise CommandError(refusal)
    return rows


async def list_dead_letters(api: AdminAPI, endpoint: str, group: str,
                            limit: int) -> BrokerAnswers[tuple[DeadLetters, list[dict[str, Any]]]]:
    """What `dlq list` shows: per broker (one, or through a name server each of the DLQ topic's
    route) its `DeadLetters` and up to `limit` rows (`_row`: dlq_offset, msg_id, origin_msg_id,
    topic, why, reconsume_times, stored_at, keys, tags, body preview, resent)."""
    return await _listed_on_each_broker(api, endpoint, group, limit)


@admin_group.group("dlq")
def dlq_group() -> None:
    """Dead-letter queues (%DLQ%<group>): list their messages and resend them."""


@dlq_group.command("list", epilog=example_epilog("rocketq admin dlq list --group order-audit --limit 20"))
@click.option("--group", "-g", required=True, help="Consumer group whose dead-letter queue to read.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000),
              help="Show at most this many messages, oldest first.")
@command_options
def list_command(group: str, limit: int, endpoints: str, as_json: bool) -> None:
    """List the messages in the group's dead-letter queue, oldest first: original topic, why it is
    there (e.g. "failed 17 times (max reconsume times 16)"), keys, a body preview, whether resent."""
    found = run_admin(endpoints, lambda api, address: _listed_on_each_broker(api, address, group, limit))
    stored = sum(letters.max_offset - letters.min_offset for letters, _ in found.values())
    rows = [{"broker": answer.broker_name, **row} if found.via_name_server else row
            for answer in found.answers for row in answer.value[1]]
    emit(rows, as_json, title=f"{dlq_topic(group)} ({stored} messages)",
         columns=[*(["broker"] if found.via_name_server else []), "dlq_offset", "msg_id", "origin_msg_id", "topic",
                  "why", "reconsume_times", "stored_at", "keys", "body", "resent"],
         empty=f"no dead letters for group {group!r}")


async def _listed_on_each_broker(api: AdminAPI, endpoint: str, group: str,
                                 limit: int) -> BrokerAnswers[tuple[DeadLetters, list[dict[str, Any]]]]:
    """`_listed` of the broker at `endpoint`, or through a name server of every broker that the
    DLQ topic's route names (none when the name server knows no such topic)."""
    try:
        return await on_each_broker(api, endpoint, lambda address: _listed(api, address, group, limit),
                                    topic=dlq_topic(group))
    except TopicNotExist:
        return BrokerAnswers(True, [])


@dlq_group.command("resend", epilog=example_epilog("rocketq admin dlq resend --group order-audit --all"))
@click.option("--group", "-g", required=True, help="Consumer group whose dead-letter queue to resend from.")
@click.option("--msg-id", help="Resend this message (its DLQ msg id or its ORIGIN_MESSAGE_ID).")
@click.option("--all", "resend_all", is_flag=True,
              help="Resend every message after the group's resend mark, then move the mark.")
@click.option("--force", is_flag=True,
              help="Resend a message even if it was resent before (e.g. dlq resend -g G --msg-id ID --force).")
@command_options
def resend_command(group: str, msg_id: str | None, resend_all: bool, force: bool, endpoints: str,
                   as_json: bool) -> None:
    """Send dead letters back to their original topics with reconsume_times reset to 0. A message
    resent before (its copy carries DLQ_RESENT_FROM) is skipped unless --force; --msg-id of such
    a message is refused (exit 1). Through a name server, the DLQ of every broker that the DLQ
    topic's route names is resent from (each copy sent by the broker that held the dead letter)."""
    if bool(msg_id) == resend_all:
        raise click.UsageError("give exactly one of --msg-id ID or --all")

    async def on_each(api: AdminAPI, endpoint: str) -> BrokerAnswers[list[dict[str, Any]]]:
        try:
            return await on_each_broker(api, endpoint, lambda address: _resend_on_broker(
                api, address, group, msg_id or None, force=force), topic=dlq_topic(group))
        except TopicNotExist:                 # the name server routes no DLQ topic of the group
            return BrokerAnswers(True, [])

    done = run_admin(endpoints, on_each)
    rows = [{"broker": answer.broker_name, **row} if done.via_name_server else row
            for answer in done.answers for row in answer.value]
    refusal = _refusal(group, msg_id, rows)
    if refusal:
        fail(refusal, EXIT_REFUSED)
    emit(rows, as_json, title=f"resent from {dlq_topic(group)}",
         columns=[*(["broker"] if done.via_name_server else []), "dlq_offset", "dlq_msg_id", "origin_msg_id", "topic",
                  "queue_id", "new_msg_id"],
         empty="nothing to resend", footer=f"{sum(1 for r in rows if r['queue_id'] != '')} message(s) resent")
