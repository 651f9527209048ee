"""Metrics stay bounded whatever clients send (request codes, topic and group names), and a scrape
of a large exposition is rendered off the event loop, so sends are not stalled by it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from broker.broker import Broker
from broker.metric_tables import CounterTable
from broker.process import BrokerSubprocess
from client.admin_api import AdminAPI
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol import native
from protocol.codes import ResponseCode
from protocol.command import request
from protocol.frame import encode_frame_bytes
from tests.conftest import broker_config
from tests.helpers import free_port, pull_header, read_commands, send

LABELS = {"cluster": "c", "node_id": "n"}


def _free_port() -> int:
    return free_port()      # below the ephemeral range: no outgoing connection takes it meanwhile


def _label_sets(text: str, sample_name: str) -> list[dict[str, str]]:
    return [s.labels for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == sample_name]


def test_a_table_past_its_bound_counts_new_keys_as_other_and_prune_frees_places() -> None:
    table = CounterTable((("m", "doc"),), ["topic"], LABELS, max_label_sets=3)
    for topic in ("a", "b", "c", "d", "e"):
        table.row((topic,))[0] += 1
    assert table.rows == {("a",): [1.0], ("b",): [1.0], ("c",): [1.0], ("other",): [2.0]}
    assert table.prune(lambda key: key[0] != "b") == 1
    table.row(("f",))[0] += 1
    assert sorted(table.rows) == [("a",), ("c",), ("f",), ("other",)]


async def test_unknown_request_codes_share_one_label(tmp_path: Path) -> None:
    """10,000 distinct unserved request codes add one label set ("unknown"), not 10,000."""
    async with Broker(broker_config(tmp_path)) as broker:
        before_rows = len(broker.metrics.rpc_latency.rows)
        before_bytes = len(await broker.metrics.render())
        host, port = broker.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for start in range(100_000, 110_000, 1_000):
                writer.write(b"".join(encode_frame_bytes(request(code)) for code in range(start, start + 1_000)))
                async with asyncio.timeout(10):
                    responses = await read_commands(reader, 1_000)
                assert {r.code for r in responses} == {ResponseCode.REQUEST_CODE_NOT_SUPPORTED}
        finally:
            writer.close()
        assert len(broker.metrics.rpc_latency.rows) - before_rows <= 1
        text = (await broker.metrics.render()).decode()
    assert len(text) - before_bytes < 4_096
    unknown = [labels for labels in _label_sets(text, "rocketmq_rpc_latency_count")
               if labels["request_code"] == "unknown"]
    assert unknown == [{"cluster": "DefaultCluster", "node_id": "broker-a", "request_code": "unknown",
                        "response_code": str(int(ResponseCode.REQUEST_CODE_NOT_SUPPORTED))}]


async def test_topic_and_group_labels_are_bounded_and_dropped_with_their_topic(
        tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, metrics_max_label_sets=4)) as broker:
        for i in range(10):
            await send(client_api, broker.address, f"topic-{i}")
        for group in ("g1", "g2", "g3", "g4", "g5", "g6"):
            await client_api.pull_message(broker.address, pull_header(topic="topic-0", group=group), 3_000)
        text = (await broker.metrics.render()).decode()
        sent = {s.labels["topic"]: s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == "rocketmq_messages_in_total"}
        assert sent == {"topic-0": 1, "topic-1": 1, "topic-2": 1, "topic-3": 1, "other": 6}
        assert len(_label_sets(text, "rocketmq_messages_out_total")) == 5      # 4 groups + "other"
        for group, topic, queue_id in (("a", "topic-2", 1), ("a", "topic-2", 2), ("a", "topic-2", 3),
                                       ("a", "topic-3", 1), ("b", "topic-3", 0)):   # b's queue holds 1 message
            await client_api.update_consumer_offset(broker.address, group, topic, queue_id, 0)
        text = (await broker.metrics.render()).decode()
        lag = {(s.labels["topic"], s.labels["queue_id"]): s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == "rocketmq_consumer_lag_messages"}
        assert len(lag) == 5 and lag[("other", "other")] == 1       # the 5th queue, sorted by group
        admin = AdminAPI(client_api.remoting)
        await admin.delete_topic(broker.address, "topic-1")
        text = (await broker.metrics.render()).decode()
    topics = {labels["topic"] for labels in _label_sets(text, "rocketmq_messages_in_total")}
    assert topics == {"topic-0", "topic-2", "topic-3", "other"}


async def _scrape(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: broker\r\n\r\n")
        return len(await reader.read())
    finally:
        writer.close()


async def test_sends_are_not_stalled_while_a_large_exposition_is_scraped(tmp_path: Path) -> None:
    """1,000 topics x 4 queues with committed offsets: ~2.3 MB of /metrics, which took ~300 ms on the
    event loop (a send waited as long); rendered in a thread, a send's p99 meanwhile stays under
    50 ms (#35's target) with the C modules built, or under 3 times the p99 of the same probe measured
    just before the scrapes when the machine is loaded (a CI run beside other work: 63 ms with
    renders of 453 ms). On the pure-Python twins (`make test-pure`) a send shares the GIL with the
    rendering thread (50-52 ms on a loaded 2-core CI machine while a render took ~300 ms): there the
    bound is half of one render. Every bound is far below a render on the loop, which makes a send
    wait all of it. The broker runs in its own process, as in production: the test's client does
    not share its loop."""
    metrics_port = _free_port()
    async with BrokerSubprocess(tmp_path / "store", settings={"metrics_port": str(metrics_port)}) as broker:
        remoting = RemotingClient()
        try:
            api = ClientAPI(remoting)
            topics = [f"lag-{i}" for i in range(1_000)]
            for start in range(0, len(topics), 250):
                await asyncio.gather(*(api.create_topic(broker.address, t, 4) for t in topics[start:start + 250]))
                await asyncio.gather(*(api.update_consumer_offset(broker.address, "g", t, q, 0, oneway=False)
                                       for t in topics[start:start + 250] for q in range(4)))
            idle_ms: list[float] = []
            for _ in range(100):
                started = time.perf_counter()
                await send(api, broker.address, "probe")
                idle_ms.append((time.perf_counter() - started) * 1000)
            latencies_ms: list[float] = []
            scraping = True

            async def probe() -> None:
                while scraping:
                    started = time.perf_counter()
                    await send(api, broker.address, "probe")
                    latencies_ms.append((time.perf_counter() - started) * 1000)
            prober = asyncio.create_task(probe())
            started = time.perf_counter()
            sizes = [await _scrape(metrics_port) for _ in range(3)]
            scrape_ms = (time.perf_counter() - started) * 1000
            scraping = False
            await prober
        finally:
            await remoting.close()
    assert min(sizes) > 2_000_000
    latencies_ms.sort()
    assert len(latencies_ms) >= 10, f"only {len(latencies_ms)} sends in {scrape_ms:.0f} ms of scrapes"
    p99 = latencies_ms[int(len(latencies_ms) * 0.99)]
    render_ms = scrape_ms / len(sizes)
    idle_p99 = sorted(idle_ms)[98]
    bound_ms = max(50, 3 * idle_p99) if native.speedups() is not None else render_ms / 2
    assert p99 < bound_ms, (f"p99 send latency {p99:.1f} ms (max {latencies_ms[-1]:.1f}, idle p99 {idle_p99:.1f}) "
                            f"during {scrape_ms:.0f} ms of scrapes ({render_ms:.0f} ms each)")
