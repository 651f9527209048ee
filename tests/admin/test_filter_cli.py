"""`rocketq admin filter test` against a real broker: parsed form, properties read, match rates per
queue, examples, JSON output, a bad expression with its caret, an unreachable broker."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner, Result

from admin.cli import admin_group, register_commands
from broker.broker import Broker
from client.api import ClientAPI
from tests.helpers import free_port, send

register_commands()


async def invoke(*args: str) -> Result:
    """Run the command in a thread (it runs its own event loop) while this loop serves the broker."""
    return await asyncio.to_thread(CliRunner().invoke, admin_group, ["filter", "test", *args])


async def fill(api: ClientAPI, address: str) -> None:
    await api.create_topic(address, "ft", queue_nums=2)
    for i in range(20):
        await send(api, address, "ft", f"m{i}".encode(), queue_id=i % 2, tags="paid" if i % 4 == 0 else "refund",
                   properties={"amount": str(i * 10)} if i % 5 else None)


async def test_sql_expression_report(broker: Broker, client_api: ClientAPI) -> None:
    await fill(client_api, broker.address)
    result = await invoke("--topic", "ft", "--expression", "amount >= 100 and TAGS = 'refund'",
                          "--last", "8", "--endpoints", broker.address)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "((amount >= 100) AND (TAGS = 'refund'))" in out
    assert "reads: TAGS, amount" in out and "broker: accepted" in out
    assert "matching (3 shown)" in out and "not matching (3 shown)" in out
    assert "unknown (NULL)" in out or "-> false" in out


async def test_json_counts_per_queue(broker: Broker, client_api: ClientAPI) -> None:
    await fill(client_api, broker.address)
    result = await invoke("-t", "ft", "-e", "amount >= 100 and TAGS = 'refund'", "--last", "8",
                          "--endpoints", broker.address, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    # queue 0 holds i = 0, 2, ..., 18 (offsets 0..9), queue 1 the odd i; the last 8 are offsets 2..9
    assert [(q["queue_id"], q["from_offset"], q["to_offset"], q["examined"]) for q in report["queues"]] == \
        [(0, 2, 10, 8), (1, 2, 10, 8)]
    wanted = [i for i in range(4, 20) if i * 10 >= 100 and i % 4 and i % 5]
    assert report["matched"] == len(wanted)
    unknown = [i for i in range(4, 20) if i % 5 == 0 and i % 4]        # no amount, tag refund: NULL
    assert sum(q["unknown"] for q in report["queues"]) == len(unknown)
    assert all(e["properties"]["TAGS"] == "refund" for e in report["matching_examples"])


async def test_tag_expression(broker: Broker, client_api: ClientAPI) -> None:
    await fill(client_api, broker.address)
    result = await invoke("-t", "ft", "-e", "paid || other", "--type", "TAG", "--last", "100",
                          "--endpoints", broker.address, "--json")
    report = json.loads(result.output)
    assert report["parsed"] == "other || paid" and report["reads"] == ["TAGS"]
    assert report["examined"] == 20 and report["matched"] == 5


async def test_bad_expression_shows_a_caret_and_exits_1() -> None:
    result = await invoke("-t", "ft", "-e", "amount >> 1", "--endpoints", "127.0.0.1:1")
    assert result.exit_code == 1
    assert "line 1, column 9" in result.output
    assert "  amount >> 1\n          ^" in result.output


async def test_unreachable_broker_is_one_line_and_exit_2() -> None:
    port = free_port()                           # a port nobody listens on (below the ephemeral range)
    result = await invoke("-t", "ft", "-e", "a = 1", "--endpoints", f"127.0.0.1:{port}")
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot reach broker") and result.output.count("\n") == 1


async def test_missing_topic(broker: Broker) -> None:
    result = await invoke("-t", "nope", "-e", "a = 1", "--endpoints", broker.address)
    assert result.exit_code == 1 and "TOPIC_NOT_EXIST" in result.output
