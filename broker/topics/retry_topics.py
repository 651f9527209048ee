"""`RetryTopics`: a group's `%RETRY%` and `%DLQ%` topics, created on demand (REFERENCE.md §9), and
where a plain send to a `%RETRY%` topic goes (`route_send`)."""

from __future__ import annotations

import random
from typing import NamedTuple

from broker.retry_policy import decide_for_retry_send, dlq_reason, max_reconsume_times_of
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from protocol.codes import Perm
from protocol.errors import NoPermission, SystemError_
from protocol.message import PROPERTY_DELAY_TIME_LEVEL, PROPERTY_DLQ_REASON
from protocol.topics import RETRY_GROUP_TOPIC_PREFIX, check_group, dlq_topic, is_retry_topic, retry_topic

DLQ_PERM = Perm.READ | Perm.WRITE          # readable since RocketMQ 4.9.2 (PROTOCOL.md difference 7)


class SendRoute(NamedTuple):
    """Where a send is stored; `dlq_group` is the group whose DLQ it went to, else None."""

    topic: str
    queue_id: int
    properties: dict[str, str]
    dlq_group: str | None


class RetryTopics:
    """Creates and resolves the `%RETRY%` / `%DLQ%` topics of a group (shared by send and send-back)."""

    def __init__(self, topics: TopicConfigManager, groups: SubscriptionGroupManager) -> None:
        self._topics, self._groups = topics, groups

    @property
    def topics(self) -> TopicConfigManager:
        """The topic configs the retry and DLQ topics are kept in (whether one is durable yet)."""
        return self._topics

    def retry_queue(self, group: str) -> tuple[str, int] | None:
        """`%RETRY%<group>` created on demand with the group's `retry_queue_nums`, and a random
        queue of it; None when the group has `retry_queue_nums` <= 0 (retries are off)."""
        config = self._groups.find_or_create(group)
        if config.retry_queue_nums <= 0:
            return None
        topic = retry_topic(group)
        topic_config = self._topics.ensure(topic, config.retry_queue_nums)
        if not topic_config.writable:
            raise NoPermission(f"retry topic {topic!r} is not writable (perm {topic_config.perm})")
        queue_nums = topic_config.write_queue_nums
        return topic, random.randrange(queue_nums) if queue_nums > 1 else 0

    def dlq_queue(self, group: str) -> tuple[str, int]:
        """`%DLQ%<group>`: 1 queue, readable and writable, created on demand."""
        topic = dlq_topic(group)
        topic_config = self._topics.ensure(topic, 1, perm=DLQ_PERM)
        if not topic_config.writable:
            raise NoPermission(f"dead-letter topic {topic!r} is not writable (perm {topic_config.perm})")
        return topic, 0

    def retry_max_times(self, group: str) -> int:
        return self._groups.find_or_create(group).retry_max_times

    def route_send(self, topic: str, queue_id: int, reconsume_times: int, max_reconsume_times: int | None,
                   properties: dict[str, str]) -> SendRoute:
        """Where a plain send to `topic` goes. Unchanged unless `topic` is `%RETRY%<group>`: then the
        retry topic is created with the group's `retry_queue_nums` if missing, and when
        `reconsume_times` reached the maximum (the header's, else the group's `retry_max_times`)
        the message goes to `%DLQ%<group>` queue 0 without its DELAY, with a DLQ_REASON. RocketMQ
        `SendMessageProcessor#handleRetryAndDLQ`."""
        if not is_retry_topic(topic):
            return SendRoute(topic, queue_id, properties, None)
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
        remark = check_group(group)
        if remark is not None:
            raise SystemError_(remark)
        maximum = max_reconsume_times_of(max_reconsume_times, self.retry_max_times(group))
        if decide_for_retry_send(reconsume_times, maximum, group) is None:
            self.retry_queue(group)
            return SendRoute(topic, queue_id, properties, None)
        dlq, dlq_queue_id = self.dlq_queue(group)
        dead = {k: v for k, v in properties.items() if k != PROPERTY_DELAY_TIME_LEVEL}
        dead[PROPERTY_DLQ_REASON] = dlq_reason(reconsume_times, 0, maximum)
        return SendRoute(dlq, dlq_queue_id, dead, group)
