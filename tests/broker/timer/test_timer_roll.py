"""Timer roll (a message due beyond `timer_roll_window_slots` is stored again when the window ends,
so commit-log retention never deletes its only copy), the timer log's delivered prefix given back
to the file system, and the timer figures on /metrics."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.broker import Broker
from broker.timer.timer_wheel_state import TimerState
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.store import StoreConfig
from protocol.topics import TIMER_TOPIC
from tests.broker.timer.test_timer_durability import drain
from tests.conftest import TEST_DELAY_LEVELS, broker_config
from tests.helpers import send, wait_until

SEGMENT_BYTES = 64 * 1024


async def test_a_message_due_past_retention_is_rolled_and_delivered_once_after_its_file_is_deleted(
        tmp_path: Path) -> None:
    store = StoreConfig(path=tmp_path / "store", commit_log_segment_bytes=SEGMENT_BYTES,
                        consume_queue_segment_units=1_000, message_delay_level=TEST_DELAY_LEVELS,
                        file_reserved_time_hours=0, delete_when="*", clean_resource_interval_ms=3_600_000)
    config = broker_config(tmp_path, store=store, timer_roll_window_slots=5)     # 500 ms at 100 ms slots
    api = ClientAPI(RemotingClient())
    try:
        async with Broker(config) as broker:
            assert broker.timer is not None and broker.store is not None
            timer, message_store = broker.timer, broker.store
            due = int(time.time() * 1000) + 2_500
            await send(api, broker.address, "later", b"past retention", properties={"TIMER_DELIVER_MS": str(due)})
            await wait_until(lambda: timer.enqueued >= 1, 5, "enqueued")
            first_copy = message_store.read_queue_units(TIMER_TOPIC, 0, 0, 1)[0][0]
            for index in range(160):                       # ~2.5 files of other messages after it
                await send(api, broker.address, "filler", bytes(1_000), queue_id=index % 4)
            await wait_until(lambda: timer.rolled >= 1, 5, "rolled once")
            await message_store.flush()
            await message_store.clean_now()
            assert message_store.commit_log_min_offset() > first_copy, "the file of the first copy is deleted"
            assert timer.delivered == 0
            seen, stored = await drain(api, broker.address, "later", {b"past retention"}, 10)
            assert seen == Counter({b"past retention": 1})
            assert stored[0][1] >= due, "never early"
            await wait_until(lambda: timer.delivered == 1, 5, "counted delivered")
            assert timer.scheduled == 0
            text = (await broker.metrics.render()).decode()
            for name, low in (("rocketq_timer_rolled_total", 1), ("rocketq_timer_delivered_total", 1),
                              ("rocketq_timer_enqueued_total", 2)):
                assert _value(text, name) >= low, name
            assert _value(text, "rocketq_timer_scheduled_messages") == 0
            assert _value(text, "rocketq_timer_delivery_lateness_seconds_count") == 1
    finally:
        await api.remoting.close()


async def test_the_scheduled_gauge_counts_pending_timer_messages(tmp_path: Path) -> None:
    api = ClientAPI(RemotingClient())
    try:
        async with Broker(broker_config(tmp_path)) as broker:
            assert broker.timer is not None
            due = int(time.time() * 1000) + 60_000
            for index in range(3):
                await send(api, broker.address, "later", b"%d" % index, properties={"TIMER_DELIVER_MS": str(due)})
            await wait_until(lambda: broker.timer is not None and broker.timer.enqueued == 3, 5, "enqueued")
            text = (await broker.metrics.render()).decode()
            assert _value(text, "rocketq_timer_scheduled_messages") == 3
            assert _value(text, "rocketq_timer_delivered_total") == 0
    finally:
        await api.remoting.close()


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _deliver_all(state: TimerState, now_ms: int) -> int:
    delivered = 0
    while True:
        records, wait_ms = state.dequeue.next_due(now_ms, 4_096, 1_000_000)
        if not records and wait_ms > 0:
            return delivered
        state.dequeue.delivered(len(records))
        delivered += len(records)


def test_the_delivered_prefix_of_the_timer_log_is_dropped_and_a_restart_reads_on(tmp_path: Path) -> None:
    t0 = 1_700_000_000_000
    state = TimerState(tmp_path, 100, 10_000, t0, roll_window_ms=1_000)
    state.enqueue([(index * 100, 100, t0 + 500 + index % 400) for index in range(4_000)], t0)
    log_path = tmp_path / "timerlog"
    size, blocks = state.log.size, os.stat(log_path).st_blocks
    assert size == 4_000 * 32
    assert _deliver_all(state, t0 + 2_000) == 4_000
    assert state.save(state.progress()) >= size - 4_096, "all whole pages below the mark dropped"
    assert os.stat(log_path).st_blocks < blocks and state.log.size == size
    assert state.save(state.progress()) == 0, "dropped once"
    state.close()
    again = TimerState(tmp_path, 100, 10_000, t0 + 2_000, roll_window_ms=1_000)   # positions kept
    assert again.log.size == size and again.dequeue.slot == state.dequeue.slot
    again.enqueue([(10**6, 100, t0 + 2_500), (10**6 + 100, 100, t0 + 60_000)], t0 + 2_000)
    assert _deliver_all(again, t0 + 3_200) == 2, "the due one and the roll record (due at +1 s)"
    records = [again.log.read(size), again.log.read(size + 32)]
    assert [r.deliver_ms for r in records if r is not None] == [t0 + 2_500, t0 + 3_000]
    assert again.save(again.progress()) == 0, "before a restart's bound (max delay) nothing is dropped"
    again.close()


def test_a_unit_due_beyond_the_roll_window_is_wheeled_at_the_window_end(tmp_path: Path) -> None:
    t0 = 1_700_000_000_000
    state = TimerState(tmp_path, 100, 86_400_000, t0, roll_window_ms=5_000)
    state.enqueue([(0, 100, t0 + 4_000), (100, 100, t0 + 3_600_000)], t0)
    assert state.scheduled(t0 + 4_000).records == 1
    assert state.scheduled(t0 + 5_000).records == 1, "rolled: due at the window's end"
    assert state.scheduled(t0 + 3_600_000).records == 0
    state.close()


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("enqueue"), st.tuples(st.integers(1, 400), st.integers(1, 10_000))),   # (count, delay)
    st.tuples(st.just("advance"), st.integers(0, 3_000)),
    st.tuples(st.just("checkpoint"), st.just(0))), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS)
def test_a_restart_from_any_checkpoint_reaches_every_record_not_yet_delivered(tmp_path_factory: pytest.TempPathFactory,
                                                                            steps: list[tuple[str, Any]]) -> None:
    """Whatever the enqueues, delays (rolled past 1 s), deliveries and checkpoints (each dropping
    what it may of the log), a restart from the last checkpoint still reads every record that was
    not delivered before it."""
    directory = tmp_path_factory.mktemp("timer")
    now = t0 = 1_700_000_000_000
    state = TimerState(directory, 100, 10_000, now, roll_window_ms=1_000)
    pending: set[int] = set()
    next_id = 0
    for op, arg in steps:
        if op == "enqueue":
            count, delay = arg          # a batch over several pages of the log, delays spread up to 10 s
            units = [(next_id + i, 100, now + (delay + i * 37) % 10_000 + 1) for i in range(count)]
            next_id += len(units)
            state.enqueue(units, now)
            pending.update(unit[0] for unit in units)
        elif op == "advance":
            now += arg
            pending.difference_update(r.commit_log_offset for r in _due_records(state, now))
        else:
            state.save(state.progress())
            restarted = TimerState(directory, 100, 10_000, now, roll_window_ms=1_000)
            try:
                reached = {r.commit_log_offset for r in _due_records(restarted, t0 + 10**7)}
            finally:
                restarted.close()
            assert pending <= reached, f"{sorted(pending - reached)[:5]} not reachable after the restart"
    state.close()


def _due_records(state: TimerState, now_ms: int) -> list[Any]:
    records: list[Any] = []
    while True:
        due, wait_ms = state.dequeue.next_due(now_ms, 4_096, 1_000_000)
        if not due and wait_ms > 0:
            return records
        state.dequeue.delivered(len(due))
        records += due
