"""Subscription-group configs (RocketMQ `SubscriptionGroupConfig`), auto-created on first use."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from broker.persist import DurableTable
from protocol.errors import SubscriptionGroupNotExist, SystemError_
from protocol.headers import MAX_BROKER_ID
from protocol.topics import check_group


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    notify_consumer_ids_changed_enable: bool = True
    consume_message_orderly: bool = False     # RocketMQ 5's FIFO group: POP hands a queue out in order
    broker_id: int = 0                        # slave_read_enable: the broker a pull in memory is sent to
    which_broker_when_consume_slowly: int = 1     # ... and one behind by more than the memory ratio


class SubscriptionGroupManager(DurableTable):
    """group → `SubscriptionGroupConfig`, persisted as `config/subscription_groups.json`: each change
    written at once (`DurableTable`); the admin requests await `wait_durable` before answering. A
    group auto-created by a pull or heartbeat is written at once too, but not waited for: it has
    the defaults, and would be made again the same way."""

    file_name = "subscription_groups.json"
    table_key = "subscription_group_table"

    def __init__(self, *, auto_create: bool) -> None:
        self._groups: dict[str, SubscriptionGroupConfig] = {}
        self._auto_create = auto_create
        super().__init__()

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._groups.get(group)

    def groups(self) -> list[SubscriptionGroupConfig]:
        return [self._groups[g] for g in sorted(self._groups)]

    def delete(self, group: str) -> bool:
        """Remove a group's config; False when there was none."""
        if self._groups.pop(group, None) is None:
            return False
        self.drop_line(group)
        return True

    def find_or_create(self, group: str) -> SubscriptionGroupConfig:
        """The group's config; created with defaults when auto-creation is on (RocketMQ's
        `autoCreateSubscriptionGroup`, default true), else `SubscriptionGroupNotExist`."""
        config = self._groups.get(group)
        if config is None:
            if not self._auto_create:
                raise SubscriptionGroupNotExist(f"subscription group {group!r} does not exist")
            config = self.update(SubscriptionGroupConfig(group_name=group))
        return config

    def update(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        remark = check_group(config.group_name)
        if remark is not None:
            raise SystemError_(remark)
        if not 0 <= config.retry_queue_nums <= 1024 or config.retry_max_times < 0:
            raise SystemError_("retry_queue_nums must be within 0..1024 and retry_max_times ≥ 0")
        if not all(0 <= broker_id <= MAX_BROKER_ID
                   for broker_id in (config.broker_id, config.which_broker_when_consume_slowly)):
            raise SystemError_(f"broker_id and which_broker_when_consume_slowly must be within 0..{MAX_BROKER_ID}")
        self._groups[config.group_name] = config
        self.set_line(config.group_name, asdict(config))
        return config

    def load_json(self, value: Any) -> None:
        for group, raw in value.get(self.table_key, {}).items():
            config = self._groups[group] = SubscriptionGroupConfig(**raw)
            self.lines[group] = self.line_of(group, asdict(config))
