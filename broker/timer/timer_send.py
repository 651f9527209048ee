"""`TimerSends`: what a send does with a timer message (RocketMQ 5 `HookUtils.checkIfTimerMessage`
and `transformTimerMessage`): its due time is checked and computed at the send, and a message due
later is stored in `rmq_sys_wheel_timer` queue 0 with TIMER_OUT_MS, REAL_TOPIC and REAL_QID; one
due now or in the past is stored in its topic at once, without the timer properties. A DELAY
level wins over the timer properties, which are dropped (as RocketMQ)."""

from __future__ import annotations

from collections.abc import Callable

from broker.timer.deliver_time import deliver_at_ms, has_delay_level, is_timer_message, to_timer_properties
from broker.timer.deliver_time import without_timer_properties as _without
from protocol.topics import TIMER_TOPIC


class TimerSends:
    """`now_ms`: the broker's clock; `max_delay_ms`: `timer_max_delay_sec` * 1000."""

    def __init__(self, now_ms: Callable[[], int], max_delay_ms: int) -> None:
        self._now_ms, self.max_delay_ms = now_ms, max_delay_ms

    def due_ms(self, properties: dict[str, str]) -> int | None:
        """The due time of a timer message still to wait (epoch ms); None for any other message
        (no timer property, a DELAY level, or due now or earlier). Raises `MessageIllegal` for a
        bad value or one beyond `timer_max_delay_sec` (`deliver_time.deliver_at_ms`)."""
        if not is_timer_message(properties) or has_delay_level(properties):
            return None
        now = self._now_ms()
        due = deliver_at_ms(properties, now, self.max_delay_ms)
        return due if due > now else None

    @staticmethod
    def plain(properties: dict[str, str]) -> dict[str, str]:
        """`properties` of a message sent as is: without timer properties when it had some."""
        return _without(properties) if is_timer_message(properties) else properties

    @staticmethod
    def route(topic: str, queue_id: int, properties: dict[str, str],
              due_ms: int | None) -> tuple[str, int, dict[str, str]]:
        """Where a message is stored: (topic, queue_id, properties) as sent when `due_ms` is None,
        else the timer topic's queue 0 with the timer properties."""
        if due_ms is None:
            return topic, queue_id, properties
        return TIMER_TOPIC, 0, to_timer_properties(properties, topic, queue_id, due_ms)
