"""System topics: names no client may create, change or delete through the admin requests, and
the few no client may send to (RocketMQ 4.9 `TopicValidator.isSystemTopic` / `isNotAllowedSendTopic`).

System topics are RocketMQ's set (`TBW102`, `SCHEDULE_TOPIC_XXXX`, `BenchmarkTest`,
`RMQ_SYS_TRANS_HALF_TOPIC`, `RMQ_SYS_TRACE_TOPIC`, `RMQ_SYS_TRANS_OP_HALF_TOPIC`,
`TRANS_CHECK_MAX_TIME_TOPIC`, `SELF_TEST_TOPIC`, `OFFSET_MOVED_EVENT`), any name starting with
`rmq_sys_` or `RMQ_SYS_`, the broker's own cluster and broker names (RocketMQ adds both with
`addSystemTopic`), and, beyond RocketMQ, the `%RETRY%` / `%DLQ%` topics, which only the broker creates
(send-back, heartbeats, the `%RETRY%` send route) with the group's queue counts. RocketMQ answers
UPDATE_AND_CREATE_TOPIC / DELETE_TOPIC on a system topic with SYSTEM_ERROR ("conflict with system
topic"); we answer NO_PERMISSION (16), as it does for a send to a forbidden topic, so a client can
tell a refusal from a failure. Pure."""

from __future__ import annotations

from protocol.errors import NoPermission
from protocol.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, SCHEDULE_TOPIC, TIMER_TOPIC

AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
NOT_ALLOWED_SEND_TOPICS = frozenset({
    SCHEDULE_TOPIC, TIMER_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
SYSTEM_TOPICS = NOT_ALLOWED_SEND_TOPICS | {AUTO_CREATE_TOPIC_KEY_TOPIC, "BenchmarkTest", "RMQ_SYS_TRACE_TOPIC"}
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_", RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)


class SystemTopics:
    """The system topics of one broker: the fixed set plus its `cluster_name` and `broker_name`."""

    def __init__(self, *, cluster_name: str, broker_name: str) -> None:
        self._names = SYSTEM_TOPICS | {cluster_name, broker_name}

    def is_system(self, topic: str) -> bool:
        return topic in self._names or topic.startswith(SYSTEM_TOPIC_PREFIXES)

    def require_admin_may_change(self, topic: str, action: str) -> None:
        """Raises `NoPermission` naming `topic` and `action` ("create or update", "delete") when
        `topic` is a system topic."""
        if self.is_system(topic):
            raise NoPermission(f"topic {topic!r} is a system topic: {action} refused (the broker "
                               f"manages it itself)")


def require_sendable(topic: str) -> None:
    """Raises `NoPermission` for a topic no client may send to (`NOT_ALLOWED_SEND_TOPICS`, RocketMQ
    `isNotAllowedSendTopic`: "Sending message to topic[..] is forbidden")."""
    if topic in NOT_ALLOWED_SEND_TOPICS:
        hint = {SCHEDULE_TOPIC: ": set a DELAY level on the message instead",
                TIMER_TOPIC: ": set TIMER_DELIVER_MS (deliver_time_ms) on the message instead"}.get(topic, "")
        raise NoPermission(f"sending to {topic} is forbidden: it is a system topic{hint}")
