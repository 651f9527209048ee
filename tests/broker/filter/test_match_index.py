"""`MatchIndex`: matching offsets recorded per registered expression and queue, coverage, gaps,
trimming and the bound on registrations."""

from __future__ import annotations

from broker.filter.match_index import MatchIndex
from broker.filter.sql92 import compile_expression

EVEN = compile_expression("n IN ('0', '2', '4', '6', '8')")


def arrive(index: MatchIndex, topic: str, queue_id: int, offsets: range) -> None:
    for queue_offset in offsets:
        index.on_arrival(topic, queue_id, queue_offset, {"n": str(queue_offset % 10)})


def test_records_matching_offsets_from_the_first_arrival_after_registration() -> None:
    index = MatchIndex()
    arrive(index, "t", 0, range(0, 5))                 # before registration: not recorded
    index.register("t", EVEN)
    assert index.lookup("t", EVEN.text, 0) is None
    arrive(index, "t", 0, range(5, 30))
    arrive(index, "other", 0, range(0, 10))
    matches = index.lookup("t", EVEN.text, 0)
    assert matches is not None and matches.start_offset == 5 and matches.next_offset == 30
    assert matches.matches_from(5, 100) == [o for o in range(5, 30) if o % 2 == 0]
    assert matches.matches_from(13, 3) == [14, 16, 18]
    assert matches.covers(5, 30) and matches.covers(29, 30)
    assert not matches.covers(4, 30), "offsets before the first arrival were not seen"
    assert not matches.covers(10, 31), "an arrival it did not see"
    assert index.lookup("t", EVEN.text, 1) is None and index.lookup("t", "n = 1", 0) is None


def test_a_gap_restarts_coverage() -> None:
    index = MatchIndex()
    index.register("t", EVEN)
    arrive(index, "t", 0, range(0, 10))
    arrive(index, "t", 0, range(12, 20))
    matches = index.lookup("t", EVEN.text, 0)
    assert matches is not None and matches.start_offset == 12 and matches.matches_from(0, 100) == [12, 14, 16, 18]


def test_lists_are_trimmed_to_their_bound() -> None:
    index = MatchIndex(max_offsets_per_queue=8)
    index.register("t", EVEN)
    arrive(index, "t", 0, range(0, 40))
    matches = index.lookup("t", EVEN.text, 0)
    assert matches is not None and len(matches.offsets) <= 8
    assert matches.start_offset == matches.offsets[0] and matches.next_offset == 40
    assert matches.matches_from(0, 100) == [o for o in range(matches.start_offset, 40) if o % 2 == 0]


def test_registrations_are_bounded_oldest_dropped() -> None:
    index = MatchIndex(max_expressions=2)
    expressions = [compile_expression(f"n = '{i}'") for i in range(3)]
    for expression in expressions:
        index.register("t", expression)
        index.register("t", expression)                 # again: no-op
    assert index.registered_count == 2
    arrive(index, "t", 0, range(0, 10))
    assert index.lookup("t", expressions[0].text, 0) is None
    assert [index.lookup("t", e.text, 0).matches_from(0, 10) for e in expressions[1:]] == [[1], [2]]  # type: ignore[union-attr]
    index.unregister("t", expressions[1].text)
    index.unregister("t", "never registered")
    assert index.registered_count == 1


def test_unknown_and_missing_properties_do_not_match() -> None:
    index = MatchIndex()
    index.register("t", compile_expression("a > 1"))
    for queue_offset, properties in enumerate([{}, {"a": "x"}, {"a": "2"}, {"a": "1"}]):
        index.on_arrival("t", 0, queue_offset, properties)
    matches = index.lookup("t", "a > 1", 0)
    assert matches is not None and matches.matches_from(0, 10) == [2]
