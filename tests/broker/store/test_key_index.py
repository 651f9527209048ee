"""`KeyIndex`: keys → offsets, newest first, bounded, with time bounds; a batch's messages indexed
in C as in Python."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.key_index import KeyIndex, index_keys, index_keys_py, message_keys
from protocol import native

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


def test_the_oldest_keys_are_forgotten_past_max_entries() -> None:
    index = KeyIndex(3)
    index.add("t", {"KEYS": "a"}, 1, 1)
    index.add("t", {"KEYS": "a"}, 2, 2)                        # "a" now holds two entries
    index.add("t", {"UNIQ_KEY": "u"}, 3, 3)
    index.add("t", {"UNIQ_KEY": "v"}, 4, 4)                    # 4 entries > 3: "a" (2 entries) goes
    assert index.query("t", "a", 10) == [] and len(index) == 2
    assert index.query("t", "u", 10) == [3] and index.query("t", "v", 10) == [4]


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


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
@given(batch=st.lists(st.tuples(properties_strategy, offsets_strategy), max_size=12),
       start=st.integers(0, 12), time_bits=st.integers(0, (1 << 44) - 1), before=st.booleans())
def test_the_c_index_writes_the_table_the_python_twin_writes(batch: list[tuple[dict[str, str], int]], start: int,
                                                             time_bits: int, before: bool) -> None:
    assert index_keys is not index_keys_py
    properties, units = [p for p, _ in batch], [(offset, 0, 0) for _, offset in batch]
    tables: list[OrderedDict[str, Any]] = []
    stops = []
    for index in (index_keys, index_keys_py):
        table: OrderedDict[str, Any] = OrderedDict({"t#u2": 5, "t#u3": [6, 7]} if before else {})
        stops.append(index(table, "t#", properties, units, start, time_bits))
        tables.append(table)
    assert stops[0] == stops[1]
    assert list(tables[0].items()) == list(tables[1].items())     # same keys, entries and order


@pytest.mark.parametrize("index", [
    pytest.param(index_keys, marks=pytest.mark.skipif(native_records is None, reason="broker.store._records "
                                                                                      "was not built")),
    index_keys_py])
@pytest.mark.parametrize(("properties", "unit"), [
    ({"UNIQ_KEY": 7}, (1, 0, 0)),                  # a UNIQ_KEY that is not str
    ({"KEYS": ["k"]}, (1, 0, 0)),                  # KEYS that are not a str
    ({"UNIQ_KEY": "u", "KEYS": b"k"}, (1, 0, 0)),
    ({"UNIQ_KEY": "u"}, (-1, 0, 0)),               # a negative offset
    ({"KEYS": "k"}, (1 << 63, 0, 0)),              # an offset past 64 bits
    ({"UNIQ_KEY": "u"}, [1, 0, 0]),                # a unit that is not a tuple
    ({"UNIQ_KEY": "u"}, (True, 0, 0)),             # an offset that is not an int
    (OrderedDict(UNIQ_KEY="u"), (1, 0, 0)),        # properties that are not a dict
])
def test_the_index_leaves_anything_unusual_to_key_index_add(index: Any, properties: Any, unit: Any) -> None:
    table: dict[str, Any] = {}
    assert index(table, "t#", [{"UNIQ_KEY": "a", "KEYS": "b a"}, properties], [(3, 0, 0), unit], 0, 9) == (1, 2)
    assert table == {"t#b": 3 << 44 | 9, "t#a": 3 << 44 | 9}


def test_a_message_is_indexed_under_each_distinct_word_then_its_uniq_key() -> None:
    assert message_keys("b a b", "a") == ["b", "a"]
    assert message_keys("x\ty\u00a0z", "u") == ["x", "y", "z", "u"]    # str.split(): any whitespace
    assert message_keys("   ", "u") == ["u"] and message_keys("", "") == [] and message_keys(None, None) == []
    index = KeyIndex(10)
    index.add("t", {"KEYS": "k " * 10_000, "UNIQ_KEY": "u"}, 5, 1)       # 10,000 words, one key
    index.add_run("t", [{"KEYS": "k " * 10_000}], [(6, 0, 0)], 1)
    assert len(index) == 3 and index.query("t", "k", 10) == [6, 5] and index.query("t", "u", 10) == [5]
