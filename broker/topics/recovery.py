"""Start-up recovery of topic configs from the store: a topic whose consume queues hold messages but
which has no config (its `topics.json` entry was lost: a store from before configs were written
before answering, a file restored from an old backup, or any other loss) gets one back, with a
queue count covering every queue that has data, so nothing acknowledged is unreachable.

RocketMQ rebuilds nothing here: such a topic stays unknown to it (pulls answer TOPIC_NOT_EXIST)
until someone creates it again, and a send auto-creates it with the default 4 queues, leaving
queues 4.. of a wider topic unreachable. We rebuild it and say so in a warning per topic.

Topics deleted on purpose are remembered in `topics.json` (`deleted_topics`) and never come
back; `SCHEDULE_TOPIC_XXXX` and the transaction topics (half, op, check-max) have no config by design."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from broker.topics.retry_topics import DLQ_PERM
from broker.topics.topic_config_manager import TopicConfig, TopicConfigManager
from protocol.codes import Perm
from protocol.errors import ServiceNotAvailable, SystemError_
from protocol.topics import (
    SCHEDULE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    is_dlq_topic,
    is_retry_topic,
)

log = logging.getLogger(__name__)

INTERNAL_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC})
MAX_QUEUE_NUMS = 1024


def configs_to_recover(queues_with_data: Iterable[tuple[str, int]], known: Callable[[str], object],
                       deleted: set[str], default_queue_nums: int) -> list[TopicConfig]:
    """The configs to create for topics with data in `queues_with_data` ((topic, queue_id) pairs)
    that `known(topic)` does not find (None) and that are neither deleted nor internal. Queue count:
    the highest queue id with data + 1, at least `default_queue_nums` for a plain topic (what an
    auto-create would give it), at most 1024; `%RETRY%` / `%DLQ%` topics get exactly what their
    data needs, a DLQ readable and writable (as the broker creates it). Sorted by topic. Pure."""
    highest: dict[str, int] = {}
    for topic, queue_id in queues_with_data:
        if topic not in INTERNAL_TOPICS and topic not in deleted and known(topic) is None:
            highest[topic] = max(highest.get(topic, 0), queue_id)
    configs = []
    for topic, queue_id in sorted(highest.items()):
        internal = is_retry_topic(topic) or is_dlq_topic(topic)
        queue_nums = min(queue_id + 1 if internal else max(queue_id + 1, default_queue_nums), MAX_QUEUE_NUMS)
        perm = DLQ_PERM if is_dlq_topic(topic) else Perm.READ | Perm.WRITE
        configs.append(TopicConfig(topic=topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums,
                                   perm=perm))
    return configs


async def recover_topic_configs(topics: TopicConfigManager, queue_keys: Iterable[tuple[str, int]],
                                max_offset: Callable[[str, int], int], default_queue_nums: int) -> list[TopicConfig]:
    """Create the configs `configs_to_recover` finds missing among the store's consume queues
    (`queue_keys`, those with `max_offset` > 0 having data), forget deleted topics none of whose
    queues is left, and wait until `topics.json` holds the result. Returns the configs created
    (each logged). A file that cannot be written (a full disk) is logged, not raised: the broker
    starts with the configs in memory and writes them with the next change."""
    keys = list(queue_keys)
    with_data = [(topic, queue_id) for topic, queue_id in keys if max_offset(topic, queue_id) > 0]
    topics.forget_deleted(topics.deleted - {topic for topic, _ in keys})
    recovered = []
    for config in configs_to_recover(with_data, topics.get, topics.deleted, default_queue_nums):
        queues = sorted(queue_id for topic, queue_id in with_data if topic == config.topic)
        try:
            topics.update(config)
        except SystemError_ as exc:
            log.error("topic %s has messages in queues %s but no config, and cannot get one: %s",
                      config.topic, queues, exc)
            continue
        log.warning("topic %s has messages in queues %s but no config (topics.json lost it or predates "
                    "it): recovered with %d read/write queues, perm %d (RocketMQ rebuilds nothing here)",
                    config.topic, queues, config.read_queue_nums, config.perm)
        recovered.append(config)
    try:
        await topics.wait_durable()
    except ServiceNotAvailable as exc:
        log.error("recovered topic configs are in memory only: %s", exc)
    return recovered
