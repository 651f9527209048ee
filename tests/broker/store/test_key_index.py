"""`KeyIndex`: keys → offsets, newest first, bounded, with time bounds."""

from __future__ import annotations

from broker.store.key_index import KeyIndex


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
    at_once.add_run("t", batch, list(range(len(batch))), 7)
    assert len(at_once) == len(one_by_one)
    for key in ("u1", "u2", "u3", "k1", "k2", ""):
        assert at_once.query("t", key, 10) == one_by_one.query("t", key, 10)
