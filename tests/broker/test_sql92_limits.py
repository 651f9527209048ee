"""SQL92 expressions on a real broker: one over a bound is refused with SUBSCRIPTION_PARSE_FAILED
naming it, at once, wherever it arrives (a pull's own subscription, a heartbeat, CHECK_CLIENT_CONFIG);
a large one within the bounds is compiled in a thread; meanwhile sends are answered as usual."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from broker.broker import Broker
from broker.process import BrokerSubprocess
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.bodies import CheckClientRequestBody, ConsumerData, HeartbeatData, SubscriptionData
from protocol.errors import SubscriptionParseFailed
from protocol.model import PullStatus
from tests.broker.test_sql92_pull import sql_pull
from tests.helpers import pull_header, send

HUGE_OR = " OR ".join(f"a = {i}" for i in range(100_000))           # 1.3 MB
DEEP = "(" * 10_000 + "a = 1" + ")" * 10_000
MANY_TERMS = " OR ".join(f"a = {i}" for i in range(2_000))           # 22 KB


@contextlib.asynccontextmanager
async def probe_sends(address: str) -> AsyncIterator[list[float]]:
    """Sends one message at a time on a connection of its own while the block runs; yields the
    list of their latencies in ms (filled as they complete)."""
    remoting = RemotingClient()
    api, latencies_ms, running = ClientAPI(remoting), list[float](), True
    await send(api, address, "probe")

    async def probe() -> None:
        while running:
            started = time.perf_counter()
            await send(api, address, "probe")
            latencies_ms.append((time.perf_counter() - started) * 1000)
    task = asyncio.create_task(probe())
    try:
        yield latencies_ms
    finally:
        running = False
        await task
        await remoting.close()


async def _refused_quickly(call: Awaitable[object], bound: str) -> None:
    started = time.perf_counter()
    with pytest.raises(SubscriptionParseFailed) as caught:
        async with asyncio.timeout(1):
            await call
    assert time.perf_counter() - started < 1.0
    assert bound in caught.value.remark and len(caught.value.remark) < 1_000


async def test_expressions_over_a_bound_are_refused_at_once_while_sends_go_on(
        broker: Broker, client_api: ClientAPI) -> None:
    """A 100,000-term OR blocked the loop 6.6 s and was answered SYSTEM_ERROR (RecursionError);
    10,000 nested parentheses the same. Now SUBSCRIPTION_PARSE_FAILED within 1 s, naming the bound."""
    await send(client_api, broker.address, "lim")
    async with probe_sends(broker.address) as latencies_ms:
        for expression, bound in ((HUGE_OR, "sql92_max_expression_bytes"), (DEEP, "sql92_max_depth"),
                                  (MANY_TERMS, "sql92_max_terms")):
            await _refused_quickly(client_api.pull_message(broker.address, sql_pull(expression, topic="lim"), 5_000),
                                   bound)
            body = CheckClientRequestBody(client_id="c1", group="cg", subscription_data=SubscriptionData(
                topic="lim", sub_string=expression, expression_type="SQL92"))
            await _refused_quickly(client_api.check_client_config(broker.address, body), bound)
        # a heartbeat registers it (answered SUCCESS, the refusal logged); its pulls are refused
        sub = SubscriptionData(topic="lim", sub_string=HUGE_OR, expression_type="SQL92", sub_version=1)
        await client_api.send_heartbeat(broker.address, HeartbeatData(client_id="c1", consumer_data_set=[
            ConsumerData(group_name="hg", subscription_data_set=[sub])]))
        registered = dataclasses.replace(pull_header(topic="lim", group="hg", sys_flag=0), sub_version=1)
        await _refused_quickly(client_api.pull_message(broker.address, registered, 5_000),
                               "sql92_max_expression_bytes")
    assert latencies_ms and max(latencies_ms) < 50, f"sends took up to {max(latencies_ms):.1f} ms"


async def test_a_large_expression_within_the_bounds_is_compiled_off_the_loop(
        tmp_path: Path, client_api: ClientAPI) -> None:
    """1,000 IN lists joined by OR (56 KB, ~150 ms to compile, which held every other request as
    long, or overflowed the stack): compiled in a thread of a broker process, no send meanwhile
    waits as long as the compiling pulls take (a compile on the loop makes the send in flight wait
    all of it: about the pull's time). The bound is relative, 0.8 of the longer pull: under the
    pure-Python build a send shares the GIL with the compiling thread (~50 ms on a loaded CI
    machine), and beside other work a send took 113 ms while the pulls took 182 and 328 ms."""
    async with BrokerSubprocess(tmp_path / "store") as broker:
        await send(client_api, broker.address, "big", b"no")
        await send(client_api, broker.address, "big", b"yes", properties={"a": "999f"})
        expressions = [" OR ".join(f"a IN ('{i}a', '{i}b', '{i}c', '{i}d', '{i}e', '{i}f{n}')" for i in range(1_000))
                       for n in ("", "x")]
        results, pull_ms = [], []
        async with probe_sends(broker.address) as latencies_ms:
            for expression in expressions:
                started = time.perf_counter()
                results.append(await client_api.pull_message(broker.address, sql_pull(expression, topic="big"), 10_000))
                pull_ms.append((time.perf_counter() - started) * 1000)
    assert [[m.body for m in r.messages] for r in results] == [[b"yes"], []]
    assert results[1].status is not PullStatus.FOUND
    assert latencies_ms and max(latencies_ms) < 0.8 * max(pull_ms), (
        f"sends took up to {max(latencies_ms):.1f} ms while the pulls took {pull_ms}")
