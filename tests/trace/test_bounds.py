"""The trace under hostile queries and its bounds: malformed QUERY_MESSAGE_TRACE requests are
answered with a clear error (the broker goes on serving), a key matching thousands of messages
answers at most `max_entries`, the trace files stay within `trace.max_bytes` and are deleted past
`trace.retention_hours`, and a full event queue drops (and counts) instead of waiting."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.broker import Broker
from broker.remoting.context import RequestContext
from broker.trace.recorder import TraceRecorder
from broker.trace.segments import TraceSegments, find_message_records, find_queue_records
from client.admin_api import AdminAPI
from conf.trace import TraceConfig
from protocol.channel import Channel
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.trace import NOTED, merge_timeline, noted
from tests.conftest import broker_config
from tests.helpers import free_port, scrape_metrics, send


@pytest.mark.parametrize(("fields", "says"), [
    ({}, "exactly one of msg_id or key"),
    ({"msg_id": "a", "key": "b"}, "exactly one of msg_id or key"),
    ({"msg_id": "x" * 100_000}, "at most 512"),
    ({"key": "k", "topic": "t" * 600}, "topic is 600 characters"),
    ({"msg_id": "a", "max_entries": 0}, "max_entries 0 is outside 1..10000"),
    ({"msg_id": "a", "max_entries": 2**40}, "max_entries"),
    ({"msg_id": 12345}, "msg_id"),
    ({"msg_id": ["a"], "key": {"b": 1}}, "msg_id"),
])
async def test_a_hostile_query_is_answered_with_a_clear_error(broker: Broker, admin_api: AdminAPI,
                                                              fields: dict[str, Any], says: str) -> None:
    response = await admin_api.remoting.invoke(broker.address, request(RequestCode.QUERY_MESSAGE_TRACE, fields), 5_000)
    assert response.code in (ResponseCode.SYSTEM_ERROR, ResponseCode.MESSAGE_ILLEGAL)
    assert says in (response.remark or ""), response.remark
    sent = await send(admin_api, broker.address, "orders", b"still served")
    assert [e["event"] for e in await admin_api.query_message_trace(broker.address, msg_id=sent.msg_id)] == [
        "sent", "stored"]


async def test_a_key_of_thousands_of_messages_answers_at_most_max_entries(broker: Broker, admin_api: AdminAPI) -> None:
    for _ in range(2_000):
        await send(admin_api, broker.address, "orders", b"common", properties={"KEYS": "everyone"})
    found = await admin_api.query_message_trace(broker.address, key="everyone", max_entries=50)
    assert len(found) == 50 and all(e["event"] in ("sent", "stored") for e in found)


async def test_the_trace_files_stay_within_max_bytes(tmp_path: Path, admin_api: AdminAPI) -> None:
    trace = TraceConfig(max_bytes=16_384, segment_bytes=2_048, flush_interval_ms=10)
    async with Broker(broker_config(tmp_path, trace=trace)) as broker:
        assert broker.trace is not None
        for i in range(600):        # a write per send (one SENT_SET record each: ~45 bytes)
            await send(admin_api, broker.address, "orders", b"x", properties={"KEYS": f"k{i}"})
            await broker.trace.flush()
        segments = broker.trace.segments
        files = sorted((tmp_path / "store" / "trace").glob("*.trace"))
        on_disk = sum(f.stat().st_size for f in files)
        assert on_disk <= 16_384 + 4_096 and segments.total_bytes == on_disk and len(files) >= 3
        oldest = await admin_api.query_message_trace(broker.address, key="k0")
        assert [e["event"] for e in oldest] == ["stored"], "its records were deleted: only the store knows it"
        assert len(await admin_api.query_message_trace(broker.address, key="k599")) == 2


def test_segments_past_retention_are_deleted(tmp_path: Path) -> None:
    now = [1_000_000]
    segments = TraceSegments(tmp_path, segment_bytes=1_024, max_bytes=1 << 20, retention_ms=3_600_000,
                             now_ms=lambda: now[0])
    segments.load()
    segments.append([["S", now[0] / 1000, "127.0.0.1:1", "pg", "t", 0, i, i, ["old-id", None, None, None, None]]
                     for i in range(40)])
    now[0] += 1_000
    segments.append([["S", now[0] / 1000, "127.0.0.1:1", "pg", "t", 0, 40, 40, ["new-id", None, None, None, None]]])
    segments.close()
    assert segments.segment_count >= 2
    now[0] += 3_600_000 - 500          # the old segments are past retention, the newest is not
    assert segments.enforce_retention() >= 1
    views = segments.snapshot()
    assert find_message_records(views, "old-id", 100) == [] and len(find_message_records(views, "new-id", 10)) == 1
    now[0] += 3_600_000
    segments.enforce_retention()
    assert segments.segment_count == 0 and list(tmp_path.iterdir()) == []


async def test_a_full_event_queue_drops_and_counts_instead_of_waiting(tmp_path: Path, admin_api: AdminAPI) -> None:
    port = free_port()
    trace = TraceConfig(queue_max_events=10, flush_interval_ms=60_000)
    async with Broker(broker_config(tmp_path, trace=trace, metrics_port=port)) as broker:
        for _ in range(30):
            await send(admin_api, broker.address, "orders", b"x")
        assert broker.trace is not None and broker.trace.recorder.dropped == 20
        text = await asyncio.to_thread(scrape_metrics, port)
        assert 'rocketq_trace_dropped_total{cluster="DefaultCluster",node_id="broker-a"} 20.0' in text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 5)), max_size=40),
       st.sets(st.integers(0, 45), max_size=5), st.integers(64, 600))
def test_queue_records_found_are_exactly_those_covering_an_offset(tmp_path_factory: pytest.TempPathFactory,
                                                                   pulls: list[tuple[int, int, int]],
                                                                   offsets: set[int], segment_bytes: int) -> None:
    """Whatever the segment size (summaries per file), a lookup finds exactly the pull records whose
    [from, next) covers a wanted offset of their queue, in order."""
    segments = TraceSegments(tmp_path_factory.mktemp("seg"), segment_bytes=segment_bytes, max_bytes=1 << 30,
                             retention_ms=1 << 40, now_ms=lambda: 1)
    segments.load()
    records: list[list[Any]] = [["P", i, "t", queue_id, start, start + length, "g", "127.0.0.1:1", length]
               for i, (queue_id, start, length) in enumerate(pulls)]
    for record in records:
        segments.append([record])
    segments.close()
    wanted = {("t", 1): offsets}
    found = find_queue_records(segments.snapshot(), wanted, 10_000)
    assert found == [r for r in records if r[3] == 1 and any(r[4] <= o < r[5] for o in offsets)]


@given(st.lists(st.lists(st.fixed_dictionaries({"at_ms": st.integers(0, 5), "event": st.sampled_from(
    ["sent", "stored", "delivered", "consumed", "other"]), "broker": st.sampled_from(["a", "b"])}), max_size=6),
    max_size=4))
def test_a_merged_timeline_is_sorted_and_has_each_entry_once(answers: list[list[dict[str, Any]]]) -> None:
    merged = merge_timeline(answers + answers)
    assert [e["at_ms"] for e in merged] == sorted(e["at_ms"] for e in merged)
    assert len({msgpack.packb(sorted(e.items())) for e in merged}) == len(merged)
    assert {msgpack.packb(sorted(e.items())) for a in answers for e in a} == {
        msgpack.packb(sorted(e.items())) for e in merged}
    assert merge_timeline([merged]) == merged, "a merged timeline merged again keeps its order"


def test_commits_between_two_writes_become_one_record_per_forward_run() -> None:
    recorder = TraceRecorder(max_events=100)
    for old, new in ((None, 1), (1, 2), (2, 5), (5, 2), (2, 3), (3, 4)):
        recorder.committed("10.0.0.1:5", "g", "t", 0, old, new)
    recorder.committed("10.0.0.1:5", "g", "t", 1, 7, 9)
    records = recorder.drain()
    assert [(r[3], r[4], r[5]) for r in records] == [(0, None, 5), (0, 5, 2), (0, 2, 4), (1, 7, 9)]
    assert recorder.drain() == [] and recorder.recorded == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), max_size=120), st.sets(st.integers(0, 50), max_size=5),
       st.integers(1, 200), st.integers(64, 600))
def test_usual_single_sends_are_found_by_each_queue_offset(tmp_path_factory: pytest.TempPathFactory,
                                                           sends: list[tuple[int, int]], wanted: set[int],
                                                           max_events: int, segment_bytes: int) -> None:
    """Single sends recorded as SENT_SET records (one per client and queue between two writes):
    within `queue_max_events`, every send is counted, dropped ones too; a lookup of queue offsets
    finds exactly the records holding one, and each record's offsets ascend."""
    recorder = TraceRecorder(max_events=max_events)
    next_offset = [0, 0, 0]
    kept: dict[int, list[tuple[int, str]]] = {0: [], 1: [], 2: []}
    for client, queue_id in sends:
        addr = f"10.0.0.{client}:5"
        before = recorder.dropped
        recorder.sent_usual(addr, "pg", "t", queue_id, next_offset[queue_id])
        if recorder.dropped == before:
            kept[queue_id].append((next_offset[queue_id], addr))
        next_offset[queue_id] += 1
    assert recorder.waiting == min(len(sends), max_events) and recorder.dropped == max(0, len(sends) - max_events)
    records = recorder.drain()
    assert recorder.waiting == 0 and recorder.recorded == min(len(sends), max_events)
    segments = TraceSegments(tmp_path_factory.mktemp("seg"), segment_bytes=segment_bytes, max_bytes=1 << 30,
                             retention_ms=1 << 40, now_ms=lambda: 1)
    segments.load()
    for record in records:
        assert list(record[4]) == sorted(record[4])
        segments.append([record])
    segments.close()
    found = find_queue_records(segments.snapshot(), {("t", 1): wanted}, 10_000)
    assert sorted((o, r[6]) for r in found for o in r[4] if o in wanted) == [
        (o, addr) for o, addr in kept[1] if o in wanted]
    assert all(r[3] == 1 and any(o in wanted for o in r[4]) for r in found)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from([*NOTED, "TAGS", "TRAN_MSG", "PGROUP"]), st.text(max_size=8)))
def test_noted_keeps_the_noted_properties_in_their_order(properties: dict[str, str]) -> None:
    assert noted(properties) == tuple(properties.get(name) for name in NOTED)


def test_a_check_back_and_the_commit_it_brings_in_one_millisecond_keep_their_order() -> None:
    """A check-back recorded at 12.345 ms whose commit is stored at 12.9 ms (a store time has ms
    precision: 12.000): the timeline still reads check-back, commit, stored."""
    from broker.trace.resolver import Resolver
    from protocol.topics import TRANS_HALF_TOPIC
    from protocol.trace import TRANSACTION
    resolver = Resolver("127.0.0.1:10911", 100, lambda offset: None, {})
    place = {"msg_id": "H", "uniq_key": "U", "topic": "payments", "queue_id": 0}
    resolver.locations[(TRANS_HALF_TOPIC, 0, 7)] = place
    resolver._stored_us[("payments", 0, 3)] = 12_000          # the committed copy's store time, in µs
    resolver.queue_record([TRANSACTION, 0.012345, TRANS_HALF_TOPIC, 0, 7, "checked_back", 1])
    resolver.queue_record([TRANSACTION, 0.012950, TRANS_HALF_TOPIC, 0, 7, "committed", ["payments", 0, 3]])
    resolver.entries.append({"at_ms": 12, "at_us": 12_000, "event": "stored", "broker": "127.0.0.1:10911"})
    assert [e["event"] for e in merge_timeline([resolver.entries])] == ["checked_back", "committed", "stored"]


def _found(directory: Path, segment_bytes: int, records: list[Any],
           wanted: dict[tuple[str, int], set[int]]) -> list[list[Any]]:
    """`records` written one per write into trace segments of `segment_bytes`, then looked up."""
    segments = TraceSegments(directory, segment_bytes=segment_bytes, max_bytes=1 << 30, retention_ms=1 << 40,
                             now_ms=lambda: 1)
    segments.load()
    for record in records:
        segments.append([record])
    segments.close()
    return find_queue_records(segments.snapshot(), wanted, 10_000)


class _Peer:
    """What `TraceRecorder.pulled` reads of a `Channel`: its peer's address."""

    def __init__(self, remote_address: str) -> None:
        self.remote_address = remote_address


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 6)), max_size=80),
       st.sets(st.integers(0, 60), max_size=5), st.integers(1, 120), st.integers(64, 600))
def test_pulls_are_found_by_each_queue_offset_with_their_own_times(tmp_path_factory: pytest.TempPathFactory,
                                                                   pulls: list[tuple[int, int, int]],
                                                                   wanted: set[int], max_events: int,
                                                                   segment_bytes: int) -> None:
    """Pulls recorded as PULLED_SET records (one per client, group and queue between two writes),
    sharing `queue_max_events` with the single sends: every pull is counted, dropped ones too; a
    lookup of queue offsets finds exactly the records with a pull covering one, and the timeline
    gives each such pull a "delivered" entry at that pull's own time."""
    from broker.trace.resolver import Resolver
    recorder = TraceRecorder(max_events=max_events)
    recorder.sent_usual("10.0.0.9:5", "pg", "t", 1, 0)          # a send shares the bound
    next_offset = [0, 0, 0]
    kept: list[tuple[int, int, str]] = []                       # queue 1's pulls recorded: (from, next, client)
    for client, queue_id, count in pulls:
        addr, before = f"10.0.0.{client}:5", recorder.dropped
        first = next_offset[queue_id]
        recorder.pulled(cast(Channel, _Peer(addr)), "cg", "t", queue_id, first, first + count, count)
        if recorder.dropped == before and queue_id == 1:
            kept.append((next_offset[queue_id], next_offset[queue_id] + count, addr))
        next_offset[queue_id] += count
    assert recorder.waiting == min(len(pulls) + 1, max_events)
    assert recorder.dropped == max(0, len(pulls) + 1 - max_events)
    records = recorder.drain()
    assert recorder.waiting == 0 and recorder.recorded == min(len(pulls) + 1, max_events)
    found = _found(tmp_path_factory.mktemp("seg"), segment_bytes, records, {("t", 1): wanted})
    times: dict[tuple[int, str], float] = {}                    # (from, client) -> the pull's own time
    for record in records:
        if record[0] == "L" and record[3] == 1:
            pulls_of = record[4]
            times |= {(pulls_of[i], record[6]): pulls_of[i + 3] for i in range(0, len(pulls_of), 4)}
    covering = [(low, high, addr) for low, high, addr in kept if any(low <= o < high for o in wanted)]
    pull_sets = [r for r in found if r[0] == "L"]
    assert sorted((p[i], r[6]) for r in pull_sets for p in [r[4]] for i in range(0, len(p), 4)
                  if any(p[i] <= o < p[i + 1] for o in wanted)) == sorted((low, addr) for low, _, addr in covering)
    assert all(r[3] == 1 and any(r[4][i] <= o < r[4][i + 1] for i in range(0, len(r[4]), 4) for o in wanted)
               for r in pull_sets)
    assert all(r[0] == "N" for r in found if r[0] != "L")       # the send, when 0 was wanted
    for offset in wanted:
        resolver = Resolver("127.0.0.1:10911", 1_000, lambda commit_log_offset: None, {})
        resolver.locations[("t", 1, offset)] = {"msg_id": "M", "topic": "t", "queue_id": 1, "queue_offset": offset}
        for record in found:
            resolver.queue_record(list(record))
        delivered = sorted((e["at_us"], e["client_addr"]) for e in resolver.entries if e["event"] == "delivered")
        assert delivered == sorted((int(times[(low, addr)] * 1_000_000), addr) for low, high, addr in covering
                                   if low <= offset < high)


class _Context:
    """What `TraceRecorder.sent_batch` reads of a `RequestContext`: the client's address."""

    def __init__(self, client_addr: str) -> None:
        self.client_addr = client_addr


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 5)), max_size=60),
       st.sets(st.integers(0, 50), max_size=5), st.integers(64, 600))
def test_batches_are_found_by_each_queue_offset_with_their_own_times(tmp_path_factory: pytest.TempPathFactory,
                                                                     batches: list[tuple[int, int, int]],
                                                                     wanted: set[int], segment_bytes: int) -> None:
    """Batch sends recorded as SENT_BATCH_SET records: a lookup of queue offsets finds exactly the
    records with a batch holding one, and the timeline says "sent" for it at that batch's own time
    (no store time known here), with the batch's size."""
    from broker.trace.resolver import Resolver
    recorder = TraceRecorder(max_events=10_000)
    next_offset, kept = [0, 0, 0], []
    for client, queue_id, count in batches:
        addr, first = f"10.0.0.{client}:5", next_offset[queue_id]
        recorder.sent_batch(cast(RequestContext, _Context(addr)), "pg", "t", queue_id, first, count)
        if queue_id == 1:
            kept.append((first, first + count, addr))
        next_offset[queue_id] += count
    records = recorder.drain()
    assert recorder.recorded == len(batches)
    found = _found(tmp_path_factory.mktemp("seg"), segment_bytes, records, {("t", 1): wanted})
    assert all(r[0] == "K" and r[3] == 1 for r in found)
    assert sorted((b[i], r[6]) for r in found for b in [r[4]] for i in range(0, len(b), 3)
                  if any(b[i] <= o < b[i + 1] for o in wanted)) == sorted(
        (low, addr) for low, high, addr in kept if any(low <= o < high for o in wanted))
    times = {(r[4][i], r[6]): r[4][i + 2] for r in records if r[3] == 1 for i in range(0, len(r[4]), 3)}
    for offset in wanted:
        resolver = Resolver("127.0.0.1:10911", 1_000, lambda commit_log_offset: None, {})
        resolver.locations[("t", 1, offset)] = {"msg_id": "M", "topic": "t", "queue_id": 1, "queue_offset": offset}
        for record in found:
            resolver.queue_record(list(record))
        assert sorted((e["at_us"], e["client_addr"], e["detail"]) for e in resolver.entries) == sorted(
            (int(times[(low, addr)] * 1_000_000), addr, f"producer group pg, in a batch of {high - low}")
            for low, high, addr in kept if low <= offset < high)
