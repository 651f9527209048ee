"""get_message: REFERENCE.md §2.1's status table, scan rules and caps."""

from __future__ import annotations

from pathlib import Path

from broker.store.message_store import MessageStore
from broker.store.results import GetMessageStatus
from conf.store import StoreConfig
from protocol.subscription import tags_code
from tests.broker.store.conftest import (
    PropertyFilter,
    TagFilter,
    bodies,
    crash,
    decoded,
    open_store,
    put,
    put_many,
    small_config,
)


async def test_put_then_get_round_trips_every_field(store: MessageStore) -> None:
    first = store.put_message(topic="t", queue_id=2, body=b"hello", properties={"TAGS": "A", "k": "v"},
                              flag=7, born_timestamp=123, born_host="10.0.0.2:50000", reconsume_times=2,
                              sys_flag=1)
    batch = store.put_messages(topic="t", queue_id=2, messages=[({}, 0, b"b0"), ({"TAGS": "B"}, 1, b"b1")],
                               born_timestamp=5, born_host="h:1")
    assert first.ok and batch.ok and (first.queue_offset, batch.queue_offset) == (0, 1)
    assert batch.end_offset == store.commit_log_max_offset()
    assert first.commit_log_offsets == [0] and batch.commit_log_offsets[0] > 0
    store.dispatch_available()
    result = store.get_message("t", 2, 0, 32, None)
    assert result.status is GetMessageStatus.FOUND
    assert (result.next_begin_offset, result.min_offset, result.max_offset) == (3, 0, 3)
    assert result.message_count == 3
    assert result.total_bytes == sum(len(m) for m in result.messages)
    messages = decoded(result)
    assert [m.body for m in messages] == [b"hello", b"b0", b"b1"]
    m = messages[0]
    assert (m.topic, m.queue_id, m.queue_offset) == ("t", 2, 0)
    assert (m.flag, m.sys_flag, m.reconsume_times) == (7, 1, 2)
    assert (m.born_timestamp, m.born_host, m.store_host) == (123, "10.0.0.2:50000", "10.0.0.1:10911")
    assert m.properties == {"TAGS": "A", "k": "v"} and m.store_timestamp == 1_700_000_000_000
    assert [x.commit_log_offset for x in messages] == first.commit_log_offsets + batch.commit_log_offsets
    assert [x.queue_offset for x in messages] == [0, 1, 2]


async def test_bounds_statuses(store: MessageStore, config: StoreConfig) -> None:
    result = store.get_message("never", 0, 5, 32, None)
    assert (result.status, result.next_begin_offset, result.min_offset, result.max_offset) == (
        GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
    assert not (config.path / "consumequeue" / "never").exists()       # reads create nothing
    assert store.get_message("bad/../name", 0, 0, 32, None).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
    put_many(store, 5)
    result = store.get_message("t", 0, 5, 32, None)
    assert (result.status, result.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 5)
    result = store.get_message("t", 0, 9, 32, None)
    assert (result.status, result.next_begin_offset, result.max_offset) == (
        GetMessageStatus.OFFSET_OVERFLOW_BADLY, 5, 5)
    result = store.get_message("t", 0, 4, 32, None)
    assert (result.status, result.next_begin_offset, bodies(result)) == (GetMessageStatus.FOUND, 5, [b"m4"])


async def test_offset_too_small_after_the_first_commit_log_file_is_gone(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 600, body_of=lambda i: bytes(200))      # ~3 commit log segments of 64 KiB
    await store.stop()
    first_file = config.path / "commitlog" / f"{0:020d}"
    first_file.unlink()
    store = await open_store(config)
    try:
        min_offset = store.get_min_offset("t", 0)
        assert 0 < min_offset < 600 and store.get_max_offset("t", 0) == 600
        result = store.get_message("t", 0, 0, 32, None)
        assert (result.status, result.next_begin_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, min_offset)
        assert store.get_message("t", 0, min_offset, 1, None).status is GetMessageStatus.FOUND
    finally:
        await store.stop()


async def test_offset_found_null_when_a_consume_queue_file_is_missing(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 250)
    await store.stop()
    (config.path / "consumequeue" / "t" / "0" / f"{100 * 20:020d}").unlink()
    store = await open_store(config)
    try:
        result = store.get_message("t", 0, 150, 32, None)
        assert (result.status, result.next_begin_offset) == (GetMessageStatus.OFFSET_FOUND_NULL, 200)
        assert bodies(store.get_message("t", 0, 200, 1, None)) == [b"m200"]
    finally:
        await store.stop()


async def test_message_was_removing_when_a_commit_log_file_is_gone(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 600, body_of=lambda i: bytes(200))
    await store.stop()
    (config.path / "commitlog" / f"{65536:020d}").unlink()          # the second segment
    store = await open_store(config)
    try:
        result = store.get_message("t", 0, 300, 32, None)         # units 300..399 all in that segment
        assert (result.status, result.next_begin_offset, result.messages) == (
            GetMessageStatus.MESSAGE_WAS_REMOVING, 400, [])
    finally:
        await store.stop()


async def test_max_messages_and_the_32_message_cap(store: MessageStore) -> None:
    put_many(store, 80)
    result = store.get_message("t", 0, 0, 5, None)
    assert (result.message_count, result.next_begin_offset) == (5, 5)
    result = store.get_message("t", 0, 0, 64, None)
    assert (result.message_count, result.next_begin_offset) == (32, 32)


async def test_byte_cap_but_the_first_message_always_fits(tmp_path: Path) -> None:
    store = await open_store(small_config(tmp_path, commit_log_segment_bytes=1 << 20))
    try:
        put_many(store, 4, body_of=lambda i: bytes(100 * 1024))
        result = store.get_message("t", 0, 0, 32, None)
        assert (result.message_count, result.next_begin_offset) == (2, 2)      # 3 would pass 256 KiB
        put_many(store, 2, body_of=lambda i: bytes(300 * 1024))
        result = store.get_message("t", 0, 4, 32, None)
        assert (result.message_count, result.next_begin_offset) == (1, 5)
    finally:
        await store.stop()


async def test_one_consume_queue_file_per_pull(store: MessageStore) -> None:
    put_many(store, 150)
    result = store.get_message("t", 0, 90, 32, None)
    assert (bodies(result), result.next_begin_offset) == ([f"m{i}".encode() for i in range(90, 100)], 100)


async def test_filter_skips_advance_next_begin_offset(store: MessageStore) -> None:
    for i in range(10):
        put(store, body=f"m{i}".encode(), tags="B" if i in (7, 9) else "A")
    store.dispatch_available()
    only_b = TagFilter({tags_code("B")})
    result = store.get_message("t", 0, 0, 32, only_b)
    assert result.status is GetMessageStatus.FOUND
    assert (bodies(result), result.next_begin_offset) == ([b"m7", b"m9"], 10)
    assert only_b.commit_log_calls == 0                   # TAG filters decode nothing
    result = store.get_message("t", 0, 0, 32, TagFilter({tags_code("C")}))
    assert result.status is GetMessageStatus.NO_MATCHED_MESSAGE
    assert (result.next_begin_offset, result.messages) == (10, [])
    result = store.get_message("t", 0, 0, 1, only_b)      # batch full before filtering the next unit
    assert (bodies(result), result.next_begin_offset) == ([b"m7"], 8)


async def test_untagged_messages_have_tags_code_zero(store: MessageStore) -> None:
    put_many(store, 2)
    assert store.get_message("t", 0, 0, 32, TagFilter({0})).message_count == 2


async def test_property_filter_reads_properties(store: MessageStore) -> None:
    for i in range(6):
        put(store, body=f"m{i}".encode(), properties={"color": "red" if i % 3 == 0 else "blue"})
    store.dispatch_available()
    result = store.get_message("t", 0, 0, 32, PropertyFilter("color", "red"))
    assert (bodies(result), result.next_begin_offset) == ([b"m0", b"m3"], 6)


async def test_scan_examines_at_most_800_units(tmp_path: Path) -> None:
    store = await open_store(small_config(tmp_path, consume_queue_segment_units=2000,
                                          commit_log_segment_bytes=1 << 20))
    try:
        put_many(store, 1000, tags="A")
        result = store.get_message("t", 0, 0, 32, TagFilter({tags_code("Z")}))
        assert (result.status, result.next_begin_offset) == (GetMessageStatus.NO_MATCHED_MESSAGE, 800)
        result = store.get_message("t", 0, 0, 900, TagFilter({tags_code("Z")}))
        assert result.next_begin_offset == 900
    finally:
        await store.stop()


async def test_a_reader_keeps_its_views_after_a_crash_style_close(config: StoreConfig) -> None:
    store = await open_store(config)
    put_many(store, 3)
    views = store.get_message("t", 0, 0, 32, None)
    await crash(store)                      # unmapping is deferred while views are alive
    assert [m.body for m in decoded(views)] == [b"m0", b"m1", b"m2"]
