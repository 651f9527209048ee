"""GET_BROKER_RUNTIME_INFO: what `rocketq admin broker status` shows (version, uptime, store sizes
and disk use, held pulls, connections, counts, messages in and out (totals since the start and per
second over the last ~10 s, `broker.throughput`), and the config keys that differ from the defaults).
The disk is sampled in a thread (`broker.disk`); everything else is read on the loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from broker.disk import directory_bytes, disk_usage
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.throughput import Throughput
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from conf.broker import BrokerConfig
from protocol.bodies import BrokerRuntimeInfo, encode_body
from protocol.command import RemotingCommand


def version() -> str:
    try:
        return metadata.version("rocketq")
    except metadata.PackageNotFoundError:
        return "dev"


def _flatten(value: Any, prefix: str = "") -> dict[str, str]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        result: dict[str, str] = {}
        for item in dataclasses.fields(value):
            result.update(_flatten(getattr(value, item.name), f"{prefix}{item.name}."))
        return result
    return {prefix[:-1]: str(value)}


def config_diff(config: BrokerConfig) -> dict[str, list[str]]:
    """Dotted key → [default, value] for every key whose value is not the built-in default."""
    defaults, actual = _flatten(BrokerConfig()), _flatten(config)
    return {key: [defaults.get(key, ""), value] for key, value in sorted(actual.items())
            if defaults.get(key) != value}


class RuntimeInfoProcessor:
    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, address: str, started_at_ms: int, now_ms: Callable[[], int],
                 held_pulls: Callable[[], int], connections: Callable[[], int],
                 totals: Callable[[], tuple[int, int]]) -> None:
        """`totals`: (messages put, messages got) since the start, read when asked."""
        self._config, self._store, self._topics, self._groups = config, store, topics, groups
        self._totals, self._throughput = totals, Throughput(started_at_ms)
        self._address, self._started_at_ms, self._now_ms = address, started_at_ms, now_ms
        self._held_pulls, self._connections = held_pulls, connections

    async def get_broker_runtime_info(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        path: Path = self._config.store.path
        usage, store_bytes = await asyncio.to_thread(lambda: (disk_usage(path), directory_bytes(path)))
        store, now_ms = self._store, self._now_ms()
        put_total, get_total = self._totals()
        put_tps, get_tps = self._throughput.rates(now_ms, put_total, get_total)
        info = BrokerRuntimeInfo(
            version=version(), broker_name=self._config.broker_name, cluster_name=self._config.cluster_name,
            address=self._address, started_at_ms=self._started_at_ms, uptime_ms=now_ms - self._started_at_ms,
            commit_log_min_offset=store.commit_log_min_offset(), commit_log_max_offset=store.commit_log_max_offset(),
            flush_behind_bytes=store.commit_log_max_offset() - store.commit_log_flushed_offset,
            dispatch_behind_bytes=store.reput_lag_bytes, store_path=str(path.resolve()), store_bytes=store_bytes,
            disk_total_bytes=usage.total_bytes, disk_used_bytes=usage.used_bytes, disk_free_bytes=usage.free_bytes,
            disk_used_ratio=usage.used_ratio, held_pulls=self._held_pulls(), connections=self._connections(),
            topic_count=len(self._topics.topics()), group_count=len(self._groups.groups()),
            config_diff=config_diff(self._config), msg_put_total=put_total, msg_get_total=get_total,
            put_tps=put_tps, get_tps=get_tps)
        return request.response(body=encode_body(info))
