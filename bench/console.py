"""`console_pages`: how long the web console takes to answer its pages for a cluster of 1,000
topics and 200 consumer groups (target: each page within 1 s).

A broker subprocess gets 1,000 topics of 4 queues and 200 subscription groups, each group with a
committed offset on one topic (so GET_CONSUME_STATS has queues to report). The console runs in
this process (uvicorn on this loop, as `rocketq console start`); each page is fetched over HTTP
from a thread `LOADS` times, after one warm-up load, and the median and worst are reported. The
console's CPU per page load is this process's CPU time over the loads (client thread included)."""

from __future__ import annotations

import asyncio
import statistics
import time
import urllib.request

from bench.common import Options, connected, running_broker
from bench.report import BenchResult
from console.server import ConsoleServer
from console.state import ConsoleSettings
from protocol.headers import CreateSubscriptionGroupRequestHeader

TARGET_MS = 1_000.0
EXPECT = {"topics": "t{0}<", "groups": "g{1}<", "cluster": ">{2}</div>groups"}   # every topic, every group
PAGES = {"cluster": "/", "brokers": "/brokers", "topics": "/topics", "groups": "/groups", "group": "/groups/g0",
         "topic": "/topics/t0"}


def _load(url: str, expect: str = "") -> float:
    """Milliseconds to fetch `url` whole; raises when it is not a 200 page containing `expect`."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read().decode()
    elapsed_ms = (time.perf_counter() - started) * 1000
    if expect not in body:
        raise RuntimeError(f"{url}: the page does not show {expect!r}")
    return elapsed_ms


async def console_pages(result: BenchResult, opts: Options) -> None:
    topics, groups, loads = (200, 40, 3) if opts.quick else (1_000, 200, 5)
    result.params = {"topics": topics, "groups": groups, "queues_per_topic": 4, "loads_per_page": loads}
    async with running_broker(opts) as broker, connected(broker.address, 8) as apis:
        address = broker.address
        await asyncio.gather(*(apis[t].create_topic(address, f"t{t}", queue_nums=4) for t in range(topics)))
        await asyncio.gather(*(apis[g].create_subscription_group(
            address, CreateSubscriptionGroupRequestHeader(group_name=f"g{g}")) for g in range(groups)))
        await asyncio.gather(*(apis[g].update_consumer_offset(address, f"g{g}", f"t{g % topics}", 0, 0)
                               for g in range(groups)))
        async with ConsoleServer(ConsoleSettings(endpoint=address, listen_port=0,
                                                 sample_interval_ms=600_000)) as console:
            for name, path in PAGES.items():
                url = console.url + path
                expect = EXPECT.get(name, "").format(topics - 1, groups - 1, groups)
                await asyncio.to_thread(_load, url, expect)                # warm-up, and the check
                cpu_before = time.process_time()
                times = [await asyncio.to_thread(_load, url) for _ in range(loads)]
                cpu_ms = (time.process_time() - cpu_before) * 1000 / loads
                result.add(f"{name}.median_ms", round(statistics.median(times), 1), "ms", ("≤", TARGET_MS))
                result.add(f"{name}.max_ms", round(max(times), 1), "ms")
                result.add(f"{name}.console_cpu_ms", round(cpu_ms, 1), "ms")
