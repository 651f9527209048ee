"""`KeyIndex`: keys → offsets, newest first, bounded, with time bounds; its ring (`KeyRing`) in C
answering as the Python twin."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.key_index import KeyIndex, KeyRing, KeyRingPy, message_keys
from broker.store.message_store import MessageStore
from broker.store.store_reads import _has_key
from protocol import native
from protocol.message import decode_message_batch
from tests.broker.store.conftest import put

native_records = native.load("broker.store._records")


def test_keys_and_uniq_key_are_indexed_newest_first_within_time_bounds() -> None:
    index = KeyIndex(100)
    index.add("t", {"KEYS": "order-1 shared", "UNIQ_KEY": "U1"}, 100, 1_000)
    index.add("t", {"KEYS": "shared", "UNIQ_KEY": "U2"}, 200, 2_000)
    index.add("t", {"UNIQ_KEY": "U3"}, 300, 3_000)
    index.add("other", {"KEYS": "shared"}, 400, 4_000)
    index.add("t", {}, 500, 5_000)                             # nothing to index
    assert len(index) == 7
    assert index.query("t", "shared", 10) == [200, 100]
    assert index.query("t", "shared", 1) == [200]
    assert index.query("t", "shared", 10, begin_ms=1_500) == [200]
    assert index.query("t", "shared", 10, end_ms=1_500) == [100]
    assert index.query("t", "U3", 10) == [300] and index.query("t", "order-1", 10) == [100]
    assert index.query("other", "shared", 10) == [400] and index.query("t", "missing", 10) == []


def test_the_oldest_entries_are_forgotten_past_max_entries() -> None:
    index = KeyIndex(3)
    index.add("t", {"KEYS": "a"}, 1, 1)
    index.add("t", {"KEYS": "a"}, 2, 2)                        # "a" now holds two entries
    index.add("t", {"UNIQ_KEY": "u"}, 3, 3)
    index.add("t", {"UNIQ_KEY": "v"}, 4, 4)                    # 4 entries > 3: the oldest, a@1, goes
    assert index.query("t", "a", 10) == [2] and len(index) == 3
    assert index.query("t", "u", 10) == [3] and index.query("t", "v", 10) == [4]
    for offset in range(5, 5 + 3 * 1_000):                     # the ring goes round a thousand times
        index.add("t", {"UNIQ_KEY": f"w{offset % 7}"}, offset, offset)
    assert len(index) == 3 and index.query("t", "a", 10) == [] and index.query("t", "u", 10) == []
    assert index.query("t", "w6", 10) == [3002] and index.query("t", "w0", 10) == [3003]
    assert index.query("t", "w1", 10) == [3004] and index.query("t", "w2", 10) == []


def test_large_offsets_and_times_round_trip() -> None:
    index = KeyIndex(10)
    offset, stored_at_ms = (1 << 62) + 12345, 1_800_000_000_000
    index.add("t", {"UNIQ_KEY": "big"}, offset, stored_at_ms)
    assert index.query("t", "big", 1, begin_ms=stored_at_ms, end_ms=stored_at_ms) == [offset]


def test_a_batch_indexes_as_its_messages_one_by_one() -> None:
    batch = [{"UNIQ_KEY": "u1"}, {"UNIQ_KEY": "u2", "KEYS": "k1 k2"}, {}, {"UNIQ_KEY": ""}, {"UNIQ_KEY": "u1"},
             {"KEYS": ""}, {"UNIQ_KEY": "u3", "KEYS": ""}]
    one_by_one, at_once = KeyIndex(5), KeyIndex(5)
    for offset, properties in enumerate(batch):
        one_by_one.add("t", properties, offset, 7)
    at_once.add_run("t", batch, [(offset, 0, 0) for offset in range(len(batch))], 7)
    assert len(at_once) == len(one_by_one)
    for key in ("u1", "u2", "u3", "k1", "k2", ""):
        assert at_once.query("t", key, 10) == one_by_one.query("t", key, 10)


_KEYS_VALUES = ["", "k1 k2", "k1", "k2 k1 k2", "u1 k3", "   ", "k1\tk2\n", "k3\u00a0k4", " u4 u4 "]
properties_strategy: st.SearchStrategy[dict[str, str]] = st.one_of(
    st.fixed_dictionaries({"UNIQ_KEY": st.sampled_from(["u1", "u2", "u3", ""])}),      # the usual (keys repeat)
    st.fixed_dictionaries({"UNIQ_KEY": st.sampled_from(["u1", "u4", ""]), "KEYS": st.sampled_from(_KEYS_VALUES)}),
    st.fixed_dictionaries({"KEYS": st.sampled_from(_KEYS_VALUES)}),
    st.just({}), st.just({"TAGS": "a"}))
offsets_strategy = st.integers(0, (1 << 63) - 1)


@given(batch=st.lists(st.tuples(properties_strategy, offsets_strategy), max_size=12),
       stored_at_ms=st.integers(0, (1 << 44) - 1))
def test_a_batch_added_at_once_indexes_its_messages_in_order(batch: list[tuple[dict[str, str], int]],
                                                             stored_at_ms: int) -> None:
    one_by_one, at_once = KeyIndex(1_000), KeyIndex(1_000)
    for properties, offset in batch:
        one_by_one.add("t", properties, offset, stored_at_ms)
    at_once.add_run("t", [properties for properties, _ in batch], [(offset, 0, 0) for _, offset in batch],
                    stored_at_ms)
    assert len(at_once) == len(one_by_one)
    for key in ("u1", "u2", "u3", "u4", "k1", "k2", ""):
        assert at_once.query("t", key, 100) == one_by_one.query("t", key, 100)


RINGS = [pytest.param(KeyRing, marks=pytest.mark.skipif(native_records is None, reason="broker.store._records "
                                                                                     "was not built")), KeyRingPy]


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
@given(batch=st.lists(st.tuples(properties_strategy, offsets_strategy), max_size=12),
       start=st.integers(0, 12), stored_ms=st.integers(-(1 << 63), (1 << 63) - 1), capacity=st.integers(0, 8),
       before=st.booleans())
def test_the_c_ring_answers_as_the_python_twin(batch: list[tuple[dict[str, str], int]], start: int, stored_ms: int,
                                               capacity: int, before: bool) -> None:
    assert KeyRing is not KeyRingPy
    properties, units = [p for p, _ in batch], [(offset, 0, 0) for _, offset in batch]
    answers = []
    for make in (KeyRing, KeyRingPy):
        ring = make(capacity)
        if before:
            ring.add("t#", "u2", 5, 1)
            ring.add("t#", "u3", 6, 2)
        stop = ring.add_run("t#", properties, units, start, stored_ms)
        queries = {key: ring.query("t#", key, 100, begin, end) for key in ("u1", "u2", "u3", "u4", "k1", "k2", "")
                   for begin, end in ((0, 0), (stored_ms, stored_ms), (-(1 << 63), -1))}
        answers.append((stop, len(ring), queries, ring.query("other#", "u1", 100)))
    assert answers[0] == answers[1]


@pytest.mark.parametrize("make", RINGS)
@given(operations=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, (1 << 63) - 1),
                                     st.integers(0, 9)), max_size=40),
       capacity=st.integers(0, 6), max_num=st.integers(-1, 8), begin_ms=st.integers(0, 9), end_ms=st.integers(0, 9))
def test_a_ring_holds_the_newest_entries_of_a_key_as_a_list_would(make: Any, operations: list[tuple[str, int, int]],
                                                                    capacity: int, max_num: int, begin_ms: int,
                                                                    end_ms: int) -> None:
    ring = make(capacity)
    for key, offset, stored_ms in operations:
        ring.add("t#", key, offset, stored_ms)
    held = operations[max(len(operations) - capacity, 0):] if capacity else []
    assert len(ring) == len(held)
    for key in ("a", "b", "c", "d"):
        expected = [offset for k, offset, ms in reversed(held)
                    if k == key and ms >= begin_ms and (end_ms <= 0 or ms <= end_ms)][:max(max_num, 0)]
        assert ring.query("t#", key, max_num, begin_ms, end_ms) == expected


@pytest.mark.parametrize("make", RINGS)
def test_a_ring_refuses_what_it_cannot_hold(make: Any) -> None:
    ring = make(4)
    with pytest.raises(ValueError, match="commit_log_offset"):
        ring.add("t#", "k", -1, 0)
    with pytest.raises(ValueError, match="commit_log_offset"):
        ring.add("t#", "k", 1 << 63, 0)
    with pytest.raises(OverflowError):
        ring.add("t#", "k", 1, 1 << 63)
    with pytest.raises(TypeError):
        ring.add("t#", 5, 1, 0)
    with pytest.raises(ValueError, match="0 to"):
        make(-1)
    assert len(ring) == 0 and ring.query("t#", "k", 5) == []


@pytest.mark.parametrize("make", RINGS)
@pytest.mark.parametrize(("properties", "unit"), [
    ({"UNIQ_KEY": 7}, (1, 0, 0)),                  # a UNIQ_KEY that is not str
    ({"KEYS": ["k"]}, (1, 0, 0)),                  # KEYS that are not a str
    ({"UNIQ_KEY": "u", "KEYS": b"k"}, (1, 0, 0)),
    ({"UNIQ_KEY": "u"}, (-1, 0, 0)),               # a negative offset
    ({"KEYS": "k"}, (1 << 63, 0, 0)),              # an offset past 63 bits
    ({"UNIQ_KEY": "u"}, [1, 0, 0]),                # a unit that is not a tuple
    ({"UNIQ_KEY": "u"}, (True, 0, 0)),             # an offset that is not an int
    (OrderedDict(UNIQ_KEY="u"), (1, 0, 0)),        # properties that are not a dict
])
def test_the_ring_leaves_anything_unusual_to_key_index_add(make: Any, properties: Any, unit: Any) -> None:
    ring = make(10)
    assert ring.add_run("t#", [{"UNIQ_KEY": "a", "KEYS": "b a"}, properties], [(3, 0, 0), unit], 0, 9) == (1, 2)
    assert len(ring) == 2 and ring.query("t#", "a", 5) == [3] and ring.query("t#", "b", 5) == [3]
    index = KeyIndex(10)                        # which indexes what it can of it, and raises nothing
    index.add_run("t", [{"UNIQ_KEY": "a", "KEYS": "b a"}, properties, {"UNIQ_KEY": "z"}],
                  [(3, 0, 0), unit, (4, 0, 0)], 9)
    assert index.query("t", "z", 5) == [4] and index.query("t", "a", 5) == [3]


def test_a_message_is_indexed_under_each_distinct_word_then_its_uniq_key() -> None:
    assert message_keys("b a b", "a") == ["b", "a"]
    assert message_keys("x\ty\u00a0z", "u") == ["x", "y", "z", "u"]    # str.split(): any whitespace
    assert message_keys("   ", "u") == ["u"] and message_keys("", "") == [] and message_keys(None, None) == []
    index = KeyIndex(10)
    index.add("t", {"KEYS": "k " * 10_000, "UNIQ_KEY": "u"}, 5, 1)       # 10,000 words, one key
    index.add_run("t", [{"KEYS": "k " * 10_000}], [(6, 0, 0)], 1)
    assert len(index) == 3 and index.query("t", "k", 10) == [6, 5] and index.query("t", "u", 10) == [5]


async def test_a_query_by_key_answers_only_messages_of_its_topic_and_key(store: MessageStore) -> None:
    """The ring answers by a key's hash; `query_by_key` reads each message and keeps those of the
    topic with the key (a KEYS word or the UNIQ_KEY), so another key of the same hash never shows."""
    first = put(store, "t", 0, properties={"KEYS": "k1 k2", "UNIQ_KEY": "U1"}).commit_log_offsets[0]
    second = put(store, "t", 1, properties={"KEYS": "k2"}).commit_log_offsets[0]
    put(store, "other", 0, properties={"KEYS": "k1"})
    assert [decode_message_batch(p)[0].commit_log_offset for p in store.query_by_key("t", "k2", 10)] == [second, first]
    payload = store.look_message_by_offset(first)
    assert payload is not None
    assert [_has_key(payload, "t", key) for key in ("k1", "k2", "U1")] == [True, True, True]
    assert [_has_key(payload, topic, key) for topic, key in (("other", "k1"), ("t", "k3"), ("t", "k"), ("t", ""))] \
        == [False, False, False, False]
    assert not _has_key(b"\x93\x01\x02\x03", "t", "k1") and not _has_key(b"\xc1", "t", "k1")
