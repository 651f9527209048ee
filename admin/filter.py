"""`rocketq admin filter test`: try a subscription expression against a topic's recent messages.

    rocketq admin filter test --topic orders --expression "TAGS IN ('paid') AND amount > 100" --last 500

Prints the parsed expression and the properties it reads, then, for the last N messages of each
queue (read with PULL_MESSAGE and a "*" subscription, committing nothing), how many match, and a
few examples that match and a few that do not. The expression is compiled here with the broker's
own compiler (`broker.filter.sql92`), and the broker is asked too (CHECK_CLIENT_CONFIG), so a broker
with SQL92 turned off is reported. A bad expression prints the error with a caret under its
position and exits 1; an unreachable broker is one line and exit code 2."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from admin.base import admin_group, example_epilog
from admin.common import Connection, current_connection, endpoints_option, first_endpoint
from broker.filter.sql92 import FilterSyntaxError, compile_expression
from client.api import ClientAPI
from protocol.bodies import CheckClientRequestBody, SubscriptionData
from protocol.codes import PullSysFlag
from protocol.errors import MQError, ResponseError
from protocol.headers import PullMessageRequestHeader
from protocol.message import MessageExt
from protocol.model import ExpressionType, PullStatus
from protocol.subscription import is_subscribe_all, parse_tags

TOOLS_GROUP = "TOOLS_CONSUMER"           # RocketMQ's admin tools group
EXAMPLES = 3
PULL_BATCH = 32
TIMEOUT_MS = 5_000
Matcher = Callable[[Mapping[str, str]], "bool | None"]


@dataclass(slots=True)
class QueueSample:
    queue_id: int
    from_offset: int
    to_offset: int
    examined: int = 0
    matched: int = 0
    unknown: int = 0


@dataclass(slots=True)
class Report:
    topic: str
    expression: str
    expression_type: str
    parsed: str
    reads: list[str]
    broker_check: str = "not asked"
    queues: list[QueueSample] = field(default_factory=list)
    matching: list[dict[str, Any]] = field(default_factory=list)
    not_matching: list[dict[str, Any]] = field(default_factory=list)

    @property
    def examined(self) -> int:
        return sum(q.examined for q in self.queues)

    @property
    def matched(self) -> int:
        return sum(q.matched for q in self.queues)


@click.group("filter")
def filter_group() -> None:
    """Subscription filters (TAG and SQL92 expressions)."""


@filter_group.command("test", epilog=example_epilog(
    """rocketq admin filter test --topic orders --expression "amount > 100 AND region = 'eu'" --last 500"""))
@click.option("--topic", "-t", required=True, help="Topic whose recent messages are tried.")
@click.option("--expression", "-e", required=True, help="The subscription expression.")
@click.option("--type", "expression_type", type=click.Choice(["SQL92", "TAG"], case_sensitive=False),
              default="SQL92", show_default=True, help="Expression type.")
@click.option("--last", "last", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="How many of each queue's most recent messages to try.")
@endpoints_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def filter_test(topic: str, expression: str, expression_type: str, last: int, endpoints: str, as_json: bool) -> None:
    """Show how EXPRESSION parses and how many of TOPIC's last N messages per queue it matches."""
    kind = expression_type.upper()
    try:
        parsed, reads, matcher = _compile(kind, expression)
    except FilterSyntaxError as exc:
        _fail(as_json, 1, f"{exc.reason} at line {exc.line}, column {exc.column}"
              + (f"; expected {', '.join(exc.expected)}" if exc.expected else ""), exc.caret())
    except ValueError as exc:
        _fail(as_json, 1, f"bad tag expression: {exc}")
    report = Report(topic, expression, kind, parsed, reads)
    address = first_endpoint(endpoints)
    try:
        asyncio.run(_sample(current_connection(), address, report, matcher, last))
    except ResponseError as exc:
        _fail(as_json, 1, f"broker {address}: {exc}")
    except MQError as exc:
        _fail(as_json, 2, f"cannot reach broker {address}: {exc}")
    except OSError as exc:
        _fail(as_json, 2, f"cannot reach broker {address}: {exc}")
    if as_json:
        click.echo(json.dumps(_as_dict(report), indent=2))
    else:
        _print(Console(highlight=False, soft_wrap=True), report, last)


def _compile(kind: str, expression: str) -> tuple[str, list[str], Matcher]:
    """(parsed form, properties read, matcher); raises `FilterSyntaxError` or `ValueError`."""
    if kind == ExpressionType.SQL92:
        compiled = compile_expression(expression)
        return compiled.canonical, sorted(compiled.properties), compiled.evaluate
    if is_subscribe_all(expression):
        return "*", [], lambda properties: True
    tags = parse_tags(expression)
    return " || ".join(sorted(tags)), ["TAGS"], lambda properties: properties.get("TAGS") in tags


async def _sample(connection: Connection, address: str, report: Report, matcher: Matcher, last: int) -> None:
    remoting = connection.remoting_client(connect_timeout_ms=TIMEOUT_MS)
    api = ClientAPI(remoting)
    try:
        report.broker_check = await _broker_check(api, address, report)
        route = await api.get_route_info(address, report.topic, TIMEOUT_MS)
        queue_count = max((q.read_queue_nums for q in route.queue_datas), default=0)
        for queue_id in range(queue_count):
            max_offset = await api.get_max_offset(address, report.topic, queue_id, TIMEOUT_MS)
            min_offset = await api.get_min_offset(address, report.topic, queue_id, TIMEOUT_MS)
            sample = QueueSample(queue_id, max(min_offset, max_offset - last), max_offset)
            for message in await _read(api, address, report.topic, sample):
                sample.examined += 1
                verdict = matcher(message.properties)
                if verdict is True:
                    sample.matched += 1
                    if len(report.matching) < EXAMPLES:
                        report.matching.append(_example(message))
                else:
                    sample.unknown += verdict is None
                    if len(report.not_matching) < EXAMPLES:
                        report.not_matching.append({**_example(message), "result": _word(verdict)})
            report.queues.append(sample)
    finally:
        await remoting.close()


async def _broker_check(api: ClientAPI, address: str, report: Report) -> str:
    sub = SubscriptionData(topic=report.topic, sub_string=report.expression, expression_type=report.expression_type)
    try:
        await api.check_client_config(address, CheckClientRequestBody(client_id="rocketq-admin", group=TOOLS_GROUP,
                                                                      subscription_data=sub), TIMEOUT_MS)
    except ResponseError as exc:
        return f"refused: {exc.remark.splitlines()[0]}"
    return "accepted"


async def _read(api: ClientAPI, address: str, topic: str, sample: QueueSample) -> list[MessageExt]:
    """The messages of [from_offset, to_offset) of one queue, a pull of up to 32 at a time."""
    messages: list[MessageExt] = []
    queue_offset = sample.from_offset
    while queue_offset < sample.to_offset:
        header = PullMessageRequestHeader(
            consumer_group=TOOLS_GROUP, topic=topic, queue_id=sample.queue_id, queue_offset=queue_offset,
            max_msg_nums=min(PULL_BATCH, sample.to_offset - queue_offset), sys_flag=int(PullSysFlag.SUBSCRIPTION),
            commit_offset=0, suspend_timeout_ms=0, sub_version=0, subscription="*",
            expression_type=ExpressionType.TAG.value)
        result = await api.pull_message(address, header, TIMEOUT_MS)
        if result.next_begin_offset <= queue_offset:
            break
        messages.extend(m for m in result.messages if m.queue_offset < sample.to_offset)
        queue_offset = result.next_begin_offset
        if result.status is PullStatus.OFFSET_ILLEGAL:
            break
    return messages


def _example(message: MessageExt) -> dict[str, Any]:
    return {"queue_id": message.queue_id, "queue_offset": message.queue_offset, "msg_id": message.msg_id,
            "properties": dict(sorted(message.properties.items()))}


def _word(verdict: bool | None) -> str:
    return "unknown (NULL)" if verdict is None else str(verdict).lower()


def _rate(matched: int, examined: int) -> str:
    return f"{100 * matched / examined:.1f}%" if examined else "-"


def _as_dict(report: Report) -> dict[str, Any]:
    return {"topic": report.topic, "expression": report.expression, "type": report.expression_type,
            "parsed": report.parsed, "reads": report.reads, "broker_check": report.broker_check,
            "examined": report.examined, "matched": report.matched,
            "queues": [{"queue_id": q.queue_id, "from_offset": q.from_offset, "to_offset": q.to_offset,
                        "examined": q.examined, "matched": q.matched, "unknown": q.unknown}
                       for q in report.queues],
            "matching_examples": report.matching, "not_matching_examples": report.not_matching}


def _print(console: Console, report: Report, last: int) -> None:
    console.print(f"[bold]{report.expression_type}[/bold] {report.parsed}")
    console.print(f"reads: {', '.join(report.reads) or '(no property)'}")
    console.print(f"broker: {report.broker_check}")
    table = Table(title=f"{report.topic}: last {last} messages per queue")
    for column in ("queue", "offsets", "examined", "matched", "unknown", "match rate"):
        table.add_column(column, justify="right")
    for q in report.queues:
        table.add_row(str(q.queue_id), f"{q.from_offset}..{q.to_offset}", str(q.examined), str(q.matched),
                      str(q.unknown), _rate(q.matched, q.examined))
    table.add_row("all", "", str(report.examined), str(report.matched),
                  str(sum(q.unknown for q in report.queues)), _rate(report.matched, report.examined))
    console.print(table)
    for title, examples in (("matching", report.matching), ("not matching", report.not_matching)):
        console.print(f"[bold]{title}[/bold] ({len(examples)} shown)")
        for example in examples:
            verdict = f" -> {example['result']}" if "result" in example else ""
            console.print(f"  {example['queue_id']}:{example['queue_offset']} {example['msg_id']} "
                          f"{json.dumps(example['properties'])}{verdict}")


def _fail(as_json: bool, code: int, message: str, caret: str = "") -> NoReturn:
    if as_json:
        click.echo(json.dumps({"error": message, "caret": caret} if caret else {"error": message}))
    else:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        err.print(f"error: {message}", markup=False)
        if caret:
            err.print(caret, markup=False)
    sys.exit(code)


admin_group.add_command(filter_group)
