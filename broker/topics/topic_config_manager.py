"""Topic configs: queue counts and permissions, auto-created on first send (REFERENCE.md §0, §15).

Every change is written to `config/topics.json` at once (`DurableTable`); whoever answers a client
about a change awaits `wait_durable(topic)` first, and a send is acknowledged only once the config
of the topic it was stored in is durable (`is_durable`), so a kill -9 right after a create keeps
the topic. Deleted topics are remembered (`deleted_topics`) so that start-up recovery of configs
from the store (`broker.topics.recovery`) does not bring them back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from broker.persist import DurableTable
from protocol.codes import Perm
from protocol.errors import NoPermission, SystemError_, TopicNotExist
from protocol.topics import check_topic

_READ, _WRITE = int(Perm.READ), int(Perm.WRITE)     # plain ints: IntFlag `&` costs ~1 µs, paid per request


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfig:
    topic: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = _READ | _WRITE

    def __post_init__(self) -> None:
        if type(self.perm) is not int:      # a `Perm` given: kept a plain int (see `_READ`)
            object.__setattr__(self, "perm", int(self.perm))

    @property
    def readable(self) -> bool:
        return bool(self.perm & _READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & _WRITE)


class TopicConfigManager(DurableTable):
    """topic → `TopicConfig`, persisted as `config/topics.json`."""

    file_name = "topics.json"
    table_key = "topic_config_table"

    def __init__(self, *, auto_create_topic: bool, default_queue_nums: int) -> None:
        self._topics: dict[str, TopicConfig] = {}
        self._auto_create = auto_create_topic
        self._default_queue_nums = default_queue_nums
        self.on_change: Callable[[], None] | None = None    # e.g. register with the name servers now
        self.on_created: Callable[[str], None] | None = None    # a new topic (after on_change): its name
        self.version = 0            # bumped by every change: callers may cache answers per version
        self.deleted: set[str] = set()      # deleted topics whose queues may still be in the store
        super().__init__()

    def touch(self) -> None:
        """A topic was created, changed or deleted: persist it, and tell `on_change`."""
        self.version += 1
        super().touch()
        if self.on_change is not None:
            self.on_change()

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def topics(self) -> list[TopicConfig]:
        return list(self._topics.values())

    def delete(self, topic: str) -> bool:
        """Remove a topic's config; False when there was none."""
        if self._topics.pop(topic, None) is None:
            return False
        self.deleted.add(topic)
        self.drop_line(topic)
        return True

    def forget_deleted(self, topics: set[str]) -> None:
        """Stop remembering these deleted topics (their queues are gone from the store)."""
        if topics & self.deleted:
            self.deleted -= topics
            for topic in topics:
                self.changed(topic)

    def require(self, topic: str) -> TopicConfig:
        """The config of an existing topic; raises `TopicNotExist`."""
        config = self._topics.get(topic)
        if config is None:
            raise TopicNotExist(topic)
        return config

    def require_readable_queue(self, topic: str, queue_id: int) -> TopicConfig:
        """Raises `TopicNotExist`, `NoPermission` (not readable) or SYSTEM_ERROR (queue id outside
        0..read_queue_nums-1), in PullMessageProcessor's order (REFERENCE.md §1 steps 4-5)."""
        config = self.require(topic)
        if not config.readable:
            raise NoPermission(f"topic {topic!r} is not readable (perm {config.perm})")
        if not 0 <= queue_id < max(config.read_queue_nums, config.write_queue_nums):
            raise SystemError_(f"queue_id {queue_id} is outside topic {topic!r}'s "
                               f"{config.read_queue_nums} read queues")
        return config

    def for_send(self, topic: str, queue_id: int) -> TopicConfig:
        """The topic a send writes to, created with the default queue count when auto-creation is
        on; raises `TopicNotExist`, `NoPermission` or SYSTEM_ERROR for a bad queue id."""
        config = self._topics.get(topic)
        if config is None:
            if not self._auto_create:
                raise TopicNotExist(topic)
            config = self.update(TopicConfig(topic=topic, read_queue_nums=self._default_queue_nums,
                                             write_queue_nums=self._default_queue_nums))
        if not config.writable:
            raise NoPermission(f"topic {topic!r} is not writable (perm {config.perm})")
        if not 0 <= queue_id < config.write_queue_nums:
            raise SystemError_(f"queue_id {queue_id} is outside topic {topic!r}'s "
                               f"{config.write_queue_nums} write queues")
        return config

    def ensure(self, topic: str, queue_nums: int, perm: int = _READ | _WRITE) -> TopicConfig:
        """An existing topic, or a new one with `queue_nums` queues (retry topics)."""
        config = self._topics.get(topic)
        if config is None:
            config = self.update(TopicConfig(topic=topic, read_queue_nums=queue_nums,
                                             write_queue_nums=queue_nums, perm=perm))
        return config

    def update(self, config: TopicConfig) -> TopicConfig:
        """Create or replace a topic's config (`on_change`, then `on_created` for a new topic: an
        admin create, an auto-create by a send, a retry topic). Raises SYSTEM_ERROR for a bad name
        or queue count."""
        remark = check_topic(config.topic)
        if remark is not None:
            raise SystemError_(remark)
        if not (1 <= config.read_queue_nums <= 1024 and 1 <= config.write_queue_nums <= 1024):
            raise SystemError_("read_queue_nums and write_queue_nums must be within 1..1024")
        created = config.topic not in self._topics
        self._topics[config.topic] = config
        self.deleted.discard(config.topic)
        self.set_line(config.topic, asdict(config))
        if created and self.on_created is not None:
            self.on_created(config.topic)
        return config

    def extra_json(self) -> dict[str, Any]:
        return {"deleted_topics": sorted(self.deleted)}

    def load_json(self, value: Any) -> None:
        for topic, raw in value.get(self.table_key, {}).items():
            config = self._topics[topic] = TopicConfig(**raw)
            self.lines[topic] = self.line_of(topic, asdict(config))
        self.deleted.update(value.get("deleted_topics", []))
        self.version += 1
