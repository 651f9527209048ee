"""Puts (roll-over, refusals, exact payload bytes), reput wake-ups and the queue queries."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import broker.store.record as record_module
from broker.store.message_store import MessageStore
from broker.store.record import decode_stored_fields, encode_record
from broker.store.results import PutMessageResult, PutMessageStatus
from conf.store import StoreConfig
from protocol.message import F_BODY, F_COMMIT_LOG_OFFSET, decode_message_batch, encode_stored_message
from protocol.subscription import tags_code
from tests.broker.store.conftest import (
    BORN_HOST,
    STORE_HOST,
    TickClock,
    bodies,
    eventually,
    open_store,
    put,
    put_many,
    small_config,
)


async def test_records_roll_over_to_new_segments(store: MessageStore, config: StoreConfig) -> None:
    batch = [({"TAGS": "A"}, 0, bytes([i]) * 1000) for i in range(32)]
    offsets: list[int] = []
    for _ in range(10):                                    # ~330 KiB: six 64 KiB segments
        stored = store.put_messages(topic="t", queue_id=0, messages=batch, born_timestamp=1,
                                    born_host=BORN_HOST)
        assert stored.ok
        offsets += stored.commit_log_offsets
    names = sorted(p.name for p in (config.path / "commitlog").iterdir())
    assert names == [f"{n * 65536:020d}" for n in range(len(names))] and len(names) >= 5
    for commit_log_offset in offsets:                      # no record spans two segments
        payload = store.look_message_by_offset(commit_log_offset)
        assert payload is not None and commit_log_offset % 65536 + len(payload) + 8 <= 65536
    assert any(o % 65536 == 0 for o in offsets[1:])       # some record starts a segment after a roll
    store.dispatch_available()
    got: list[bytes] = []
    queue_offset = 0
    while (result := store.get_message("t", 0, queue_offset, 32, None)).messages:
        got += bodies(result)
        queue_offset = result.next_begin_offset
    assert got == [m[2] for m in batch] * 10


async def test_batches_write_the_same_log_with_c_or_python_records(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch path's records (C `encode_run` when built, else its twin) are byte for byte the
    records the one-by-one path writes, across file roll-overs and a record too large for a file."""
    batches = [[({"TAGS": "A", "UNIQ_KEY": f"u{b}-{i}"}, i, bytes([i]) * (100 * i + 7)) for i in range(20)]
               for b in range(12)] + [[({}, 0, b"ok"), ({}, 0, bytes(70_000))]]
    logs: list[list[bytes]] = []
    for twin in (False, True):
        if twin:
            monkeypatch.setattr(record_module, "_c_encode_run", None)
        config = small_config(tmp_path / f"store-{twin}")
        store = await open_store(config, TickClock())
        try:
            results = [store.put_messages(topic="t", queue_id=1, messages=batch, born_timestamp=5,
                                          born_host=BORN_HOST) for batch in batches]
        finally:
            await store.stop()
        assert [r.status for r in results] == [PutMessageStatus.PUT_OK] * 12 + [PutMessageStatus.MESSAGE_ILLEGAL]
        logs.append([path.read_bytes() for path in sorted((config.path / "commitlog").iterdir())])
    assert len(logs[0]) >= 3 and logs[0] == logs[1]


async def test_single_puts_write_the_same_log_with_c_or_python_records(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-message path's records (C `write_record` into the map when built, else its twin)
    are byte for byte the same, across file roll-overs (a record that does not fit goes to the
    next file) and a record too large for any file (refused, nothing written)."""
    messages = [({"TAGS": "A", "UNIQ_KEY": f"u{i}"}, i, bytes([i % 256]) * (37 * i % 3_000 + 1)) for i in range(200)]
    logs: list[list[bytes]] = []
    for twin in (False, True):
        if twin:
            monkeypatch.setattr(record_module, "_c_write_record", None)
        config = small_config(tmp_path / f"store-{twin}")
        store = await open_store(config, TickClock())
        try:
            statuses = [store.put_checked_message(topic="t", queue_id=1, body=body, properties=properties, flag=flag,
                                                  born_timestamp=5, born_host=BORN_HOST, reconsume_times=0).status
                        for properties, flag, body in messages]
            too_large = store.put_message(topic="t", queue_id=1, body=bytes(70_000), properties={}, flag=0,
                                          born_timestamp=5, born_host=BORN_HOST)
        finally:
            await store.stop()
        assert statuses == [PutMessageStatus.PUT_OK] * len(messages)
        assert too_large.status is PutMessageStatus.MESSAGE_ILLEGAL
        logs.append([path.read_bytes() for path in sorted((config.path / "commitlog").iterdir())])
    assert len(logs[0]) >= 3 and logs[0] == logs[1]


async def test_stored_payload_is_exactly_encode_stored_message(store: MessageStore, clock: TickClock) -> None:
    properties = {"TAGS": "ÄÖ", "KEYS": "k1 k2", "": "empty key", "x": ""}
    clock.now_ms = 1_234_567_890_123
    result = store.put_message(topic="%RETRY%g", queue_id=3, body=b"", properties=properties, flag=-5,
                               born_timestamp=2 ** 40, born_host=BORN_HOST, reconsume_times=4, sys_flag=2)
    payload = store.look_message_by_offset(result.commit_log_offsets[0])
    assert payload is not None
    assert bytes(payload) == encode_stored_message(
        topic="%RETRY%g", queue_id=3, queue_offset=0, commit_log_offset=result.commit_log_offsets[0], flag=-5,
        sys_flag=2, born_timestamp=2 ** 40, born_host=BORN_HOST, store_timestamp=1_234_567_890_123,
        store_host=STORE_HOST, reconsume_times=4, properties=properties, body=b"")


async def test_refused_puts_write_nothing(store: MessageStore, config: StoreConfig) -> None:
    put(store)
    end = store.commit_log_max_offset()
    too_big = bytes(config.max_message_bytes + 1)
    larger_than_a_segment = bytes(70 * 1024)
    refusals = [
        store.put_message(topic="t", queue_id=0, body=too_big, properties={}, flag=0, born_timestamp=1,
                          born_host=BORN_HOST),
        store.put_messages(topic="t", queue_id=0, messages=[({}, 0, b"ok"), ({}, 0, too_big)],
                           born_timestamp=1, born_host=BORN_HOST),
        store.put_messages(topic="t", queue_id=0, messages=[({}, 0, b"ok"), ({}, 0, larger_than_a_segment)],
                           born_timestamp=1, born_host=BORN_HOST),
        store.put_messages(topic="t", queue_id=0, messages=[], born_timestamp=1, born_host=BORN_HOST),
        store.put_message(topic="../x", queue_id=0, body=b"x", properties={}, flag=0, born_timestamp=1,
                          born_host=BORN_HOST),
        store.put_message(topic="t", queue_id=-1, body=b"x", properties={}, flag=0, born_timestamp=1,
                          born_host=BORN_HOST),
    ]
    assert [r.status for r in refusals] == [PutMessageStatus.MESSAGE_ILLEGAL] * len(refusals)
    assert all(r.queue_offset == -1 and r.commit_log_offsets == [] for r in refusals)
    assert store.commit_log_max_offset() == end
    assert len(list((config.path / "commitlog").iterdir())) == 1
    assert put(store, body=b"next").queue_offset == 1
    store.dispatch_available()
    assert bodies(store.get_message("t", 0, 0, 32, None)) == [b"x", b"next"]


async def test_put_before_start_is_refused(config: StoreConfig) -> None:
    store = MessageStore(config, store_host=STORE_HOST)
    result = store.put_message(topic="t", queue_id=0, body=b"x", properties={}, flag=0, born_timestamp=1,
                               born_host=BORN_HOST)
    assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    checked = store.put_checked_message(topic="t", queue_id=0, body=b"x", properties={}, flag=0,
                                        born_timestamp=1, born_host=BORN_HOST, reconsume_times=0)
    assert checked.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    batch = store.put_checked_messages(topic="t", queue_id=0, messages=[({}, 0, b"x"), ({}, 0, b"y")],
                                       born_timestamp=1, born_host=BORN_HOST)
    assert batch.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and batch.commit_log_offsets == []
    assert not config.path.exists()


PutOutcome = tuple[list[tuple[Any, ...]], Any, list[tuple[Path, bytes]]]


async def put_outcome(path: Path, put_all: Callable[[MessageStore], list[PutMessageResult]],
                      read: Callable[[MessageStore], Any]) -> PutOutcome:
    """`put_all` into a new small store at `path`, dispatched, then `read` from it: (each result's
    status, queue offset, commit-log offsets and end offset; what `read` gave; every file but the
    checkpoint, with its bytes)."""
    config = small_config(path)
    store = await open_store(config, TickClock())
    try:
        results = [(r.status, r.queue_offset, r.commit_log_offsets, r.end_offset) for r in put_all(store)]
        store.dispatch_available()
        seen = read(store)
    finally:
        await store.stop()
    files = sorted(p for p in path.rglob("*") if p.is_file() and "checkpoint" not in p.name)
    return results, seen, [(p.relative_to(path), p.read_bytes()) for p in files]


async def test_a_checked_put_writes_what_put_message_writes(tmp_path: Path) -> None:
    """`put_checked_message` (the broker's usual send, its checks made by the caller) gives the
    results and writes the commit log, consume queue and tags codes byte for byte as `put_message`."""
    sends = [(f"t{i % 3}", i % 2, {"TAGS": f"tag{i % 4}", "UNIQ_KEY": f"u{i}", "KEYS": "k"}, i - 3,
              bytes([i]) * (50 * i + 1), i % 5) for i in range(40)]

    def put_all(checked: bool) -> Callable[[MessageStore], list[PutMessageResult]]:
        def put_each(store: MessageStore) -> list[PutMessageResult]:
            put_one = store.put_checked_message if checked else store.put_message
            return [put_one(topic=topic, queue_id=queue_id, body=body, properties=properties, flag=flag,
                            born_timestamp=7, born_host=BORN_HOST, reconsume_times=reconsume_times)
                    for topic, queue_id, properties, flag, body, reconsume_times in sends]
        return put_each

    outcomes = [await put_outcome(tmp_path / f"store-{checked}", put_all(checked),
                                  lambda store: bodies(store.get_message("t1", 1, 0, 32, None)))
                for checked in (False, True)]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0][-1][0] is PutMessageStatus.PUT_OK and len(outcomes[0][1]) == 7


async def test_a_checked_batch_put_writes_what_put_messages_writes(tmp_path: Path) -> None:
    """`put_checked_messages` (the broker's SEND_BATCH_MESSAGE, its checks made by the caller) gives
    the results and writes the commit log and consume queues byte for byte as `put_messages`, and
    indexes the same keys."""
    def properties(i: int, j: int) -> dict[str, str]:
        return {"TAGS": f"tag{j % 3}", "UNIQ_KEY": f"u{i}-{j}", **({"KEYS": "k"} if j == 1 else {})}

    batches = [(f"t{i % 2}", i % 3, [(properties(i, j), j, bytes([j]) * (200 * j + 1)) for j in range(size)])
               for i, size in enumerate([1, 2, 5, 32, 3, 17, 1, 9])]     # 143 KB: across 64 KB files

    def put_all(checked: bool) -> Callable[[MessageStore], list[PutMessageResult]]:
        def put_each(store: MessageStore) -> list[PutMessageResult]:
            put_batch = store.put_checked_messages if checked else store.put_messages
            return [put_batch(topic=topic, queue_id=queue_id, messages=messages, born_timestamp=7,
                              born_host=BORN_HOST) for topic, queue_id, messages in batches]
        return put_each

    def read(store: MessageStore) -> tuple[list[bytes], list[list[int]]]:
        keys = [store.key_index.query(topic, key, 10) for topic in ("t0", "t1") for key in ("u3-7", "k", "u0-0")]
        return bodies(store.get_message("t1", 0, 0, 64, None)), keys

    outcomes = [await put_outcome(tmp_path / f"store-{checked}", put_all(checked), read) for checked in (False, True)]
    assert outcomes[0] == outcomes[1]
    assert [status for status, *_ in outcomes[0][0]] == [PutMessageStatus.PUT_OK] * len(batches)
    read_bodies, keys = outcomes[0][1]
    assert len(read_bodies) == 32 and keys[3] != []


async def test_appends_are_dispatched_at_once_and_notify_the_listener(store: MessageStore) -> None:
    arrived: list[tuple[str, int, int, int, dict[str, str]]] = []

    def on_message_arriving(topic: str, queue_id: int, max_offset: int, tags: int,
                            props: dict[str, str]) -> None:
        arrived.append((topic, queue_id, max_offset, tags, props))

    store.set_arrival_listener(on_message_arriving)
    put(store, "t", 1, tags="A")        # reput runs in the append's own event-loop step
    assert arrived == [("t", 1, 1, tags_code("A"), {"TAGS": "A"})]
    assert store.reput_lag_bytes == 0 and store.get_max_offset("t", 1) == 1


async def test_look_message_by_offset_checks_the_offset(store: MessageStore) -> None:
    # a body that is itself a valid record: only the real record start may be returned
    inner = encode_record(encode_stored_message(
        topic="t", queue_id=0, queue_offset=0, commit_log_offset=999, flag=0, sys_flag=0, born_timestamp=0,
        born_host="", store_timestamp=0, store_host="", reconsume_times=0, properties={}, body=b"inner"))
    first = put(store, body=inner).commit_log_offsets[0]
    second = put(store, body=b"second").commit_log_offsets[0]
    payload = store.look_message_by_offset(second)
    assert payload is not None and [m.body for m in decode_message_batch(payload)] == [b"second"]
    first_payload = store.look_message_by_offset(first)
    assert first_payload is not None and decode_message_batch(first_payload)[0].body == inner
    raw = bytes(first_payload)
    inner_at = first + 8 + raw.index(inner)
    for bad in (first + 1, inner_at, second - 1, store.commit_log_max_offset(), -1, 1 << 40):
        assert store.look_message_by_offset(bad) is None, bad
        assert store.look_message_fields(bad) is None, bad
    # the send-back's lookup: the same checks, the fields decoded once
    fields = store.look_message_fields(first)
    assert fields is not None and fields[F_BODY] == inner and fields[F_COMMIT_LOG_OFFSET] == first
    assert fields == decode_stored_fields(first_payload)


async def test_search_offset_by_timestamp_picks_the_nearest(store: MessageStore, clock: TickClock) -> None:
    for stored_at_ms in (1000, 2000, 2000, 3000, 5000):
        clock.now_ms = stored_at_ms
        put(store)
    store.dispatch_available()
    cases = {2000: 1, 2400: 2, 2500: 2, 2600: 3, 0: 0, 1000: 0, 9999: 4, 4000: 3, 4001: 4, 5000: 4}
    assert {ts: store.search_offset_by_timestamp("t", 0, ts) for ts in cases} == cases
    assert store.search_offset_by_timestamp("none", 0, 1000) == 0
    assert store.get_earliest_msg_store_time("t", 0) == 1000
    assert store.get_earliest_msg_store_time("none", 0) == -1
    assert (store.get_min_offset("t", 0), store.get_max_offset("t", 0)) == (0, 5)
    assert (store.get_min_offset("none", 0), store.get_max_offset("none", 0)) == (0, 0)


async def test_queues_are_independent(store: MessageStore) -> None:
    put_many(store, 3, "a", 0)
    put_many(store, 2, "a", 1)
    put_many(store, 1, "b", 0)
    assert [store.get_max_offset(t, q) for t, q in (("a", 0), ("a", 1), ("b", 0), ("b", 1))] == [3, 2, 1, 0]


async def test_stop_writes_a_checkpoint_and_removes_abort(tmp_path: Path) -> None:
    from broker.store.checkpoint import read_checkpoint
    from tests.broker.store.conftest import open_store, small_config

    config = small_config(tmp_path)
    store = await open_store(config)
    assert (tmp_path / "abort").exists()
    put_many(store, 3)
    end = store.commit_log_max_offset()
    await store.stop()
    assert not (tmp_path / "abort").exists()
    checkpoint = read_checkpoint(tmp_path / "checkpoint")
    assert checkpoint is not None
    assert (checkpoint.commit_log_flushed_offset, checkpoint.reput_offset) == (end, end)
    assert checkpoint.queue_max_offsets == {("t", 0): 3}


async def test_a_failing_listener_does_not_stop_dispatch(store: MessageStore) -> None:
    def broken(topic: str, queue_id: int, max_offset: int, tags: int, props: dict[str, str]) -> None:
        raise RuntimeError("listener bug")

    store.set_arrival_listener(broken)
    put_many(store, 3)
    put(store)
    await eventually(lambda: store.get_max_offset("t", 0) == 4)
    assert store.reput_lag_bytes == 0
