"""The source's options and offset arithmetic (pure; no Spark session)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.spark.options import (
    Bound,
    Filter,
    SinkOptions,
    SourceOptions,
    admit,
    bind_legacy,
    offsets_from_json,
    offsets_to_json,
    parse_offset_spec,
    resolve_offset,
    split_range,
)
from protocol.model import ExpressionType
from protocol.signing import Credentials

BASE = {"endpoints": "127.0.0.1:1;127.0.0.1:2", "topic": "t"}


def test_defaults_follow_the_kafka_source() -> None:
    batch = SourceOptions.parse(BASE, streaming=False)
    assert batch.endpoints == ("127.0.0.1:1", "127.0.0.1:2")
    assert (batch.starting, batch.ending, batch.starting_timestamp_ms) == (Bound.EARLIEST, Bound.LATEST, None)
    assert batch.filter == Filter(ExpressionType.TAG, "*") and batch.filter.tags is None
    assert SourceOptions.parse(BASE, streaming=True).starting is Bound.LATEST


def test_options_are_case_insensitive_and_typed() -> None:
    options = SourceOptions.parse({**BASE, "STARTINGOFFSETS": '{"1": 5, "0": -2}', "maxrecordspertrigger": "10",
                                   "Tags": "A || B", "commitToGroup": "g", "failOnDataLoss": "false"},
                                  streaming=True)
    assert options.starting == {("", 1): 5, ("", 0): -2}
    assert options.max_records_per_trigger == 10 and options.commit_to_group == "g"
    assert options.filter.tags == frozenset({"A", "B"}) and not options.pull.fail_on_data_loss
    sql = SourceOptions.parse({**BASE, "sql": "a > 1"}, streaming=False).filter
    assert (sql.expression_type, sql.expression, sql.tags) == (ExpressionType.SQL92, "a > 1", None)
    assert SourceOptions.parse({**BASE, "startingTimestamp": "1700"}, streaming=False).starting_timestamp_ms == 1700


@pytest.mark.parametrize(("options", "streaming", "message"), [
    ({"topic": "t"}, False, "endpoints"),
    ({"endpoints": "h:1"}, False, "topic"),
    ({**BASE, "startingOffsets": "soon"}, False, "startingOffsets"),
    ({**BASE, "startingOffsets": '{"0": -3}'}, False, "startingOffsets"),
    ({**BASE, "startingOffsets": '[1]'}, False, "startingOffsets"),
    ({**BASE, "startingOffsets": "earliest", "startingTimestamp": "1"}, False, "not both"),
    ({**BASE, "endingOffsets": "latest"}, True, "batch"),
    ({**BASE, "tags": "a", "sql": "b"}, False, "not both"),
    ({**BASE, "maxRecordsPerPartition": "0"}, False, "maxRecordsPerPartition"),
    ({**BASE, "pullBatchSize": "many"}, False, "pullBatchSize"),
    ({**BASE, "failOnDataLoss": "maybe"}, False, "failOnDataLoss"),
])
def test_bad_options_name_the_option(options: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SourceOptions.parse(options, streaming=streaming)


def test_sink_options() -> None:
    sink = SinkOptions.parse({**BASE, "sendBatchSize": "16"})
    assert (sink.topic, sink.send_batch_size, sink.producer_group) == ("t", 16, "spark-sink")
    with pytest.raises(ValueError, match="topic"):
        SinkOptions.parse({"endpoints": "h:1"})


def test_offset_specs() -> None:
    assert parse_offset_spec("x", " Latest ") is Bound.LATEST
    assert parse_offset_spec("x", '{"3": 7}') == {("", 3): 7}              # the legacy form: one broker
    assert parse_offset_spec("x", '{"b": {"3": -2}, "a": {"0": 1}}') == {("b", 3): -2, ("a", 0): 1}
    for bad in ('{"b": {"x": 1}}', '{"b": 3.5}', '{"3": -3}', '[1]'):
        with pytest.raises(ValueError, match="broker name"):
            parse_offset_spec("startingOffsets", bad)


def test_legacy_offsets_bind_to_the_only_broker() -> None:
    legacy = offsets_from_json({"0": 4, "1": 2})
    assert bind_legacy(legacy, "t", ["broker-a"]) == {("broker-a", 0): 4, ("broker-a", 1): 2}
    assert bind_legacy({("b", 0): 1}, "t", ["a", "b"]) == {("b", 0): 1}
    with pytest.raises(ValueError, match="served by 2 brokers"):
        bind_legacy(legacy, "t", ["a", "b"])
    assert [resolve_offset(v, 10, 20) for v in (-2, -1, 5, 15, 25)] == [10, 20, 10, 15, 20]


@given(st.dictionaries(st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 200)), st.integers(0, 10**12)))
def test_checkpointed_offsets_round_trip_with_sorted_keys(offsets: dict[tuple[str, int], int]) -> None:
    encoded = offsets_to_json(offsets)
    assert json.dumps(encoded) == json.dumps(encoded, sort_keys=True)
    assert offsets_from_json(json.loads(json.dumps(encoded))) == offsets


@given(st.integers(0, 10**6), st.integers(0, 5_000), st.integers(1, 700))
def test_split_range_covers_the_range_in_near_equal_pieces(start: int, count: int, max_records: int) -> None:
    pieces = split_range(start, start + count, max_records)
    assert [p for piece in pieces for p in range(*piece)] == list(range(start, start + count))
    sizes = [high - low for low, high in pieces]
    assert all(0 < size <= max_records for size in sizes)
    assert not sizes or max(sizes) - min(sizes) <= 1
    assert len(pieces) == -(-count // max_records)


@given(st.dictionaries(st.integers(0, 15), st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
       st.none() | st.integers(1, 3000))
def test_admit_caps_the_batch_and_never_goes_backwards(ranges: dict[int, tuple[int, int]],
                                                       max_records: int | None) -> None:
    start = {q: low for q, (low, _) in ranges.items()}
    latest = {q: low + extra for q, (low, extra) in ranges.items()}
    end = admit(start, latest, max_records)
    assert set(end) == set(latest)
    assert all(start[q] <= end[q] <= latest[q] for q in end)
    total = sum(latest[q] - start[q] for q in latest)
    admitted = sum(end[q] - start[q] for q in end)
    assert admitted == (total if max_records is None else min(total, max_records))


def test_admit_shares_in_proportion_to_backlog() -> None:
    assert admit({0: 0, 1: 0, 2: 0}, {0: 100, 1: 300, 2: 0}, 40) == {0: 10, 1: 30, 2: 0}
    assert admit({0: 5, 1: 5}, {0: 6, 1: 6}, 1) == {0: 6, 1: 5}     # ties: the lower queue id first


def test_access_key_and_secret_key_become_credentials_and_go_together() -> None:
    source = SourceOptions.parse({**BASE, "accessKey": "reader", "SECRETKEY": "s3cret"}, streaming=False)
    sink = SinkOptions.parse({**BASE, "accesskey": "writer", "secretKey": "pw"})
    assert source.credentials == Credentials("reader", "s3cret") and sink.credentials == Credentials("writer", "pw")
    assert SourceOptions.parse(BASE, streaming=True).credentials is None and SinkOptions.parse(BASE).credentials is None
    for options in ({**BASE, "accessKey": "reader"}, {**BASE, "secretKey": "s3cret"}):
        with pytest.raises(ValueError, match="accessKey and secretKey"):
            SourceOptions.parse(options, streaming=False)
        with pytest.raises(ValueError, match="accessKey and secretKey"):
            SinkOptions.parse(options)
    assert "s3cret" not in repr(source)


def test_partitions_take_the_brokers_in_turn_so_concurrent_tasks_read_different_brokers() -> None:
    from client.spark.queues import TopicQueues
    from client.spark.reader import queue_ranges

    options = SourceOptions.parse({**BASE, "maxRecordsPerPartition": "10"}, streaming=False)
    queues = TopicQueues({"broker-a": "127.0.0.1:1", "broker-b": "127.0.0.1:2"},
                         tuple((b, q) for b in ("broker-a", "broker-b") for q in range(3)))
    ranges = {("broker-a", 0): (0, 20), ("broker-a", 1): (5, 5), ("broker-a", 2): (0, 3),
              ("broker-b", 0): (0, 1), ("broker-b", 1): (0, 2), ("broker-b", 2): (0, 0)}
    parts = [(p.broker_name, p.queue_id, p.start_offset, p.end_offset) for p in queue_ranges(options, queues, ranges)]
    assert parts == [("broker-a", 0, 0, 10), ("broker-b", 0, 0, 1), ("broker-a", 0, 10, 20), ("broker-b", 1, 0, 2),
                     ("broker-a", 2, 0, 3)]
