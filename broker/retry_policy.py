"""The send-back decision: retry topic with a growing delay, or the dead-letter queue (pure).

Mirrors RocketMQ 4.9 `SendMessageProcessor#asyncConsumerSendMsgBack` steps 6-8 (REFERENCE.md §9)
and `handleRetryAndDLQ` for a plain send to a `%RETRY%` topic."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.topics import dlq_topic, retry_topic

DEFAULT_RETRY_MAX_TIMES = 16
FIRST_RETRY_DELAY_LEVEL = 3        # "3 + reconsume_times" when the request says 0


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Where the new message goes: `topic` (`%RETRY%<group>` or `%DLQ%<group>`) and `delay_level`
    (0 for the DLQ: no delay)."""

    topic: str
    delay_level: int

    @property
    def to_dlq(self) -> bool:
        return self.delay_level == 0 and self.topic.startswith("%DLQ%")


def max_reconsume_times_of(requested: int | None, group_retry_max_times: int) -> int:
    """The header's `max_reconsume_times` when given and >= 0 (clients send -1 for "the
    default"), else the group's `retry_max_times` (16 unless configured)."""
    if requested is not None and requested >= 0:
        return requested
    return group_retry_max_times


def decide(reconsume_times: int, delay_level: int, max_reconsume_times: int, group: str) -> RetryDecision:
    """`reconsume_times` is the failed message's count so far (0 after the first delivery failed).

    - `reconsume_times >= max_reconsume_times`, or `delay_level < 0` -> `%DLQ%<group>`, level 0;
    - otherwise `%RETRY%<group>` with `delay_level`, or `3 + reconsume_times` when it is 0.
    With the defaults the 17th failure goes to the DLQ: 1 delivery + 16 retries. Raises nothing."""
    if reconsume_times >= max_reconsume_times or delay_level < 0:
        return RetryDecision(dlq_topic(group), 0)
    if delay_level == 0:
        delay_level = FIRST_RETRY_DELAY_LEVEL + reconsume_times
    return RetryDecision(retry_topic(group), delay_level)


def decide_for_retry_send(reconsume_times: int, max_reconsume_times: int, group: str) -> str | None:
    """A plain send to `%RETRY%<group>` (the client's fallback when send-back failed) carrying
    `reconsume_times`: `%DLQ%<group>` when it reached `max_reconsume_times`, else None (store it
    as sent). RocketMQ `handleRetryAndDLQ`."""
    if reconsume_times >= max_reconsume_times:
        return dlq_topic(group)
    return None


def dlq_reason(reconsume_times: int, delay_level: int, max_reconsume_times: int) -> str:
    """Why a message `decide` sends to the DLQ goes there, for its DLQ_REASON property (rocketq's:
    RocketMQ records none): "failed 17 times (max reconsume times 16)" when its reconsume times
    ran out (`reconsume_times` + 1 failed deliveries: the first and each retry), else "the consumer
    sent it to the DLQ (delay level -1)" for a negative `delay_level`. Pure."""
    if delay_level < 0 and reconsume_times < max_reconsume_times:
        return f"the consumer sent it to the DLQ (delay level {delay_level})"
    failures = reconsume_times + 1
    return f"failed {failures} time{'' if failures == 1 else 's'} (max reconsume times {max_reconsume_times})"
