"""What the cluster, topic and group pages show, gathered through the admin client API with the
admin commands' own functions (`admin.cluster.on_each_broker`, `admin.consumer.progress_report`),
so a page and `rocketq admin ... --json` agree. Every function takes the session's `AdminAPI` and
the console's endpoint (a broker, or a name server: then every broker it lists); errors are the
admin client's (`ResponseError`, `RequestTimeout`, `ConnectionClosed`) or `CommandError`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from admin.cluster import MASTER_ID, on_each_broker
from admin.common import CommandError
from admin.consumer import progress_report, running_infos
from client.admin_api import AdminAPI
from protocol.codes import Perm
from protocol.errors import ConsumerNotOnline, RequestCodeNotSupported
from protocol.topics import is_dlq_topic, is_retry_topic

T = TypeVar("T")
R = TypeVar("R")
PARALLEL_REQUESTS = 16          # the most admin requests one page has in flight at once


class Rates:
    """Per-second rates from successive readings of a counter (`rate(key, at_ms, value)`: the
    change since the previous reading of `key` over the time between, 0.0 on the first or when
    the counter went back). Bounded: keeps the newest reading of at most `max_keys` keys."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._last: dict[str, tuple[int, int]] = {}
        self.max_keys = max_keys

    def rate(self, key: str, at_ms: int, value: int) -> float:
        previous = self._last.pop(key, None)
        self._last[key] = (at_ms, value)
        while len(self._last) > self.max_keys:
            del self._last[next(iter(self._last))]
        if previous is None or at_ms <= previous[0] or value < previous[1]:
            return 0.0
        return (value - previous[1]) * 1000 / (at_ms - previous[0])


async def gather_bounded(items: Iterable[T], work: Callable[[T], Awaitable[R]],
                         limit: int = PARALLEL_REQUESTS) -> list[R]:
    """`work(item)` for each item, at most `limit` at once, results in the items' order."""
    gate = asyncio.Semaphore(limit)

    async def one(item: T) -> R:
        async with gate:
            return await work(item)
    return list(await asyncio.gather(*(one(item) for item in items)))


def perm_text(perm: int) -> str:
    return "".join(letter if perm & bit else "-" for letter, bit in (("R", Perm.READ), ("W", Perm.WRITE)))


def topic_kind(topic: str) -> str:
    """"retry", "dlq", "system" (RMQ_SYS_*, TBW102, SCHEDULE_TOPIC_XXXX, rmq_sys_*) or "normal"."""
    if is_retry_topic(topic):
        return "retry"
    if is_dlq_topic(topic):
        return "dlq"
    if topic.upper().startswith("RMQ_SYS_") or topic in ("TBW102", "SCHEDULE_TOPIC_XXXX", "OFFSET_MOVED_EVENT"):
        return "system"
    return "normal"


async def brokers(api: AdminAPI, endpoint: str, rates: Rates, now_ms: int) -> list[dict[str, Any]]:
    """Per broker: `BrokerRuntimeInfo` fields, `role` (MASTER or SLAVE, from the cluster info) and
    `in_bytes_per_s` (commit log growth since the console's previous look)."""
    found = await on_each_broker(api, endpoint, api.get_broker_runtime_info)
    try:
        info = await api.get_broker_cluster_info(endpoint)
        masters = {b.broker_addrs.get(MASTER_ID) for b in info.broker_addr_table.values()}
    except RequestCodeNotSupported:
        masters = set()
    rows = []
    for answer in found.answers:
        runtime = answer.value
        rows.append(dataclasses.asdict(runtime) | {
            "role": "MASTER" if not masters or answer.address in masters or runtime.address in masters else "SLAVE",
            "in_bytes_per_s": rates.rate(f"broker:{runtime.address}", now_ms, runtime.commit_log_max_offset)})
    return rows


async def topics(api: AdminAPI, endpoint: str) -> list[dict[str, Any]]:
    """Every topic once, by name: `topic`, `kind` (`topic_kind`), `brokers` (names; "" for the
    endpoint itself), `read_queue_nums`, `write_queue_nums` (summed over brokers), `perm` ("RW")."""
    found = await on_each_broker(api, endpoint, api.get_all_topic_config)
    merged: dict[str, dict[str, Any]] = {}
    for answer in found.answers:
        for config in answer.value:
            row = merged.setdefault(config.topic, {"topic": config.topic, "kind": topic_kind(config.topic),
                                                   "brokers": [], "read_queue_nums": 0, "write_queue_nums": 0,
                                                   "perm": perm_text(config.perm)})
            row["brokers"].append(answer.broker_name or answer.address)
            row["read_queue_nums"] += config.read_queue_nums
            row["write_queue_nums"] += config.write_queue_nums
    return [merged[name] for name in sorted(merged)]


async def topic_detail(api: AdminAPI, endpoint: str, topic: str, rates: Rates, now_ms: int) -> dict[str, Any]:
    """A topic's queues (`TopicQueueStats` fields + `messages`), `total_messages`, `max_offset_sum`
    and `in_msgs_per_s` since the console's previous look. Raises `TopicNotExist`."""
    found = await on_each_broker(api, endpoint, lambda address: api.get_topic_stats(address, topic), topic=topic)
    queues = [dataclasses.asdict(q) | {"messages": q.max_offset - q.min_offset}
              for stats in found.values() for q in stats.offset_table]
    max_offset_sum = sum(q["max_offset"] for q in queues)
    return {"topic": topic, "queues": queues, "total_messages": sum(q["messages"] for q in queues),
            "max_offset_sum": max_offset_sum, "in_msgs_per_s": rates.rate(f"topic:{topic}", now_ms, max_offset_sum)}


async def groups(api: AdminAPI, endpoint: str) -> list[dict[str, Any]]:
    """Every subscription group once, by name, with `total_lag` and `consume_tps` summed over the
    brokers that have it (one GET_CONSUME_STATS per group and broker, `PARALLEL_REQUESTS` at once)."""
    found = await on_each_broker(api, endpoint, api.get_all_subscription_groups)
    pairs = [(answer.address, g.group_name, g.consume_enable) for answer in found.answers for g in answer.value]
    stats = await gather_bounded(pairs, lambda pair: api.get_consume_stats(pair[0], pair[1]))
    merged: dict[str, dict[str, Any]] = {}
    for (_, name, enabled), consume in zip(pairs, stats, strict=True):
        row = merged.setdefault(name, {"group": name, "consume_enable": enabled, "total_lag": 0, "consume_tps": 0.0,
                                       "queues": 0})
        row["total_lag"] += sum(max(0, q.broker_offset - q.consumer_offset) for q in consume.offset_table)
        row["consume_tps"] += consume.consume_tps
        row["queues"] += len(consume.offset_table)
    return [merged[name] for name in sorted(merged)]


async def group_detail(api: AdminAPI, endpoint: str, group: str) -> dict[str, Any]:
    """`progress_report` of the group (empty queues and `total_lag` 0 when no broker has offsets
    for it) plus `clients` (`Connection` fields) and `subscriptions` of its online consumers."""
    try:
        report = await progress_report(api, endpoint, group)
    except CommandError:
        report = {"consumer_group": group, "queues": [], "total_lag": 0, "consume_tps": 0.0, "max_lag_latency_ms": 0}
    addresses = await _broker_addresses(api, endpoint)
    try:
        connection, _ = await running_infos(api, addresses, group)
    except ConsumerNotOnline:
        connection = None
    report["clients"] = [dataclasses.asdict(c) for c in connection.connection_set] if connection else []
    report["subscriptions"] = [dataclasses.asdict(s) for s in connection.subscription_table] if connection else []
    report["message_model"] = connection.message_model if connection else ""
    return report


async def _broker_addresses(api: AdminAPI, endpoint: str) -> list[str]:
    found = await on_each_broker(api, endpoint, api.get_broker_runtime_info)
    return [answer.address for answer in found.answers]
