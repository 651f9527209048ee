"""What the store's reput step calls for each dispatched message (`MessageStore.set_arrival_listener`):
the schedule and timer services for their own topics, else the SQL92 match index of registered
subscriptions and the hold service's wake of held pulls (RocketMQ's `NotifyMessageArrivingListener`
behind `CommitLogDispatcher`). Also the hold service's `has_match` test of a held filtered pull."""

from __future__ import annotations

from collections.abc import Callable

from broker.filter.filter_manager import FilterManager
from broker.filter.message_filter import MessageFilter
from broker.longpoll.hold_service import HoldService
from broker.schedule.schedule_service import ScheduleService
from broker.store.message_store import MessageStore
from broker.store.results import GetMessageStatus
from broker.timer.timer_store import TimerMessageStore
from protocol.topics import SCHEDULE_TOPIC, TIMER_TOPIC

OnArrival = Callable[[str, int, int, int, dict[str, str]], None]
OnArrivalRun = Callable[[str, int, int, list[tuple[int, int, int]], list[dict[str, str]]], None]


def hold_matcher(filters: FilterManager, store: MessageStore) -> Callable[[str, int, int, MessageFilter], bool]:
    """Whether the message at (topic, queue_id, queue_offset) passes a held pull's filter."""
    def has_match(topic: str, queue_id: int, queue_offset: int, message_filter: MessageFilter) -> bool:
        matched = filters.matches(message_filter, topic, queue_id)
        return store.get_message(topic, queue_id, queue_offset, 1, message_filter,
                                 matched).status is GetMessageStatus.FOUND
    return has_match


def arrival_listeners(filters: FilterManager, hold: HoldService, schedule: ScheduleService,
                      timer: TimerMessageStore, long_polling: bool) -> tuple[OnArrival, OnArrivalRun]:
    """(one message arrived, a run of messages of one queue arrived); held pulls are woken only
    with `long_polling` (`long_polling.enable`)."""
    notify_hold = hold.notify_message_arriving if long_polling else None
    index_arrival = filters.index.on_arrival      # SQL92 matches of registered subscriptions

    def on_arrival(topic: str, queue_id: int, max_offset: int, tags_code: int, properties: dict[str, str]) -> None:
        if topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            schedule.on_arrival(topic, queue_id) if topic == SCHEDULE_TOPIC else timer.on_arrival()
            return
        index_arrival(topic, queue_id, max_offset - 1, properties)
        if notify_hold is not None:
            notify_hold(topic, queue_id, max_offset, tags_code, properties)
    index_run = filters.index.on_arrival_run
    notify_hold_run = hold.notify_run_arriving if long_polling else None

    def on_arrival_run(topic: str, queue_id: int, queue_offset: int, units: list[tuple[int, int, int]],
                       properties: list[dict[str, str]]) -> None:
        if topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            schedule.on_arrival(topic, queue_id) if topic == SCHEDULE_TOPIC else timer.on_arrival()
            return
        index_run(topic, queue_id, queue_offset, properties)
        if notify_hold_run is not None:
            notify_hold_run(topic, queue_id, queue_offset, units, properties)
    return on_arrival, on_arrival_run
