"""`rocketq admin message trace --msg-id ID | --key K [--topic T] [--json]`: what the brokers did
with a message (issue #42; docs/operations/trace.md).

Every broker of the cluster (the endpoint's name server lists them; a broker endpoint is asked
alone) answers QUERY_MESSAGE_TRACE from its own trace; the answers are merged into one timeline,
oldest first (`protocol.trace.merge_timeline`). A message retried, sent to the DLQ or resent keeps
its UNIQ_KEY (RocketMQ's rule: the copies also carry ORIGIN_MESSAGE_ID and RETRY_TOPIC, a resend
DLQ_RESENT_FROM), so the UNIQ_KEYs found in the first answers are asked of every broker again:
a copy stored on another broker (a resend, a producer's failover) joins the same timeline."""

from __future__ import annotations

from typing import Any

import click

from admin.base import example_epilog
from admin.cluster import on_each_broker
from admin.common import command_options, format_time_ms, run_admin, show, table
from admin.message import message_group
from client.admin_api import AdminAPI
from protocol.trace import MAX_QUERY_CHARS, describe, merge_timeline, uniq_keys

MAX_LINKED = 16         # UNIQ_KEYs asked for in the second round (a key can match many messages)


async def gather_trace(api: AdminAPI, endpoint: str, *, msg_id: str = "", key: str = "", topic: str = "",
                       max_entries: int = 1_000) -> list[dict[str, Any]]:
    """The merged timeline of the messages with msg id `msg_id` (or key `key`, of `topic` when
    given) on every broker behind `endpoint`, each entry with `broker_name` added ("" when the
    endpoint is a broker). [] when no broker knows the message. Raises the brokers' errors
    (`SystemError_` for a malformed query)."""
    names: dict[str, str] = {}

    async def ask(msg_id: str, key: str = "", topic: str = "") -> list[list[dict[str, Any]]]:
        answers = await on_each_broker(api, endpoint, lambda address: api.query_message_trace(
            address, msg_id=msg_id, key=key, topic=topic, max_entries=max_entries))
        for answer in answers.answers:
            names[answer.address] = answer.broker_name
        return answers.values()

    timeline = merge_timeline(await ask(msg_id, key, topic))
    answers = [timeline]
    for uniq_key in sorted(uniq_keys(timeline) - {msg_id})[:MAX_LINKED]:
        answers += await ask(uniq_key)
    merged = merge_timeline(answers)
    for entry in merged:
        entry["broker_name"] = names.get(entry.get("broker", ""), "")
    return merged[:max_entries]


def _row(entry: dict[str, Any]) -> list[Any]:
    client = entry.get("client_id") or entry.get("client_addr") or ""
    broker = entry.get("broker_name") or entry.get("broker", "")
    return [format_time_ms(entry.get("at_ms", 0)), entry.get("event", ""), broker, entry.get("msg_id", ""),
            describe(entry), entry.get("group", ""), client, entry.get("detail", "")]


@message_group.command("trace", epilog=example_epilog(
    "rocketq admin message trace --key order-42 --topic orders --json"))
@click.option("--msg-id", "-i", "msg_id", default=None,
              help="The message's id: the UNIQ_KEY a producer's SendResult gives, or an offset msg id.")
@click.option("--key", "-k", default=None, help="A key the message was sent with (its KEYS).")
@click.option("--topic", "-t", default=None, help="Only messages of this topic (or retried from it).")
@click.option("--max", "max_entries", type=click.IntRange(1, 10_000), default=1_000, show_default=True,
              help="Most timeline entries to show.")
@command_options
def trace(msg_id: str | None, key: str | None, topic: str | None, max_entries: int, endpoints: str,
          as_json: bool) -> None:
    """The timeline of a message across the cluster: sent, stored, each delivery (pull or pop),
    consumed, sent back, retried, DLQ, resent (recorded by the brokers for every client)."""
    if (msg_id is None) == (key is None):
        raise click.UsageError("give exactly one of --msg-id or --key")
    wanted = msg_id or key or ""
    if not wanted or len(wanted) > MAX_QUERY_CHARS or len(topic or "") > MAX_QUERY_CHARS:
        raise click.UsageError(f"--msg-id, --key and --topic take 1 to {MAX_QUERY_CHARS} characters")
    timeline = run_admin(endpoints, lambda api, address: gather_trace(
        api, address, msg_id=msg_id or "", key=key or "", topic=topic or "", max_entries=max_entries))
    title = f"trace of {'message ' + wanted if msg_id else 'key ' + wanted}" + (f" in {topic}" if topic else "")
    if not timeline:
        title += ": no broker has a trace of it (unknown id, or past trace.retention_hours)"
    show(as_json, timeline, table(title, ["time", "event", "broker", "msg id", "where", "group", "client", "detail"],
                                  [_row(e) for e in timeline]))
