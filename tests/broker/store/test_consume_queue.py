"""ConsumeQueue: units, file boundaries, duplicates, truncation, reload, names; a run of units
written in C as in Python."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.consume_queue import (
    CQ_UNIT,
    UNIT_BYTES,
    ConsumeQueue,
    ConsumeQueueTable,
    write_units,
    write_units_py,
)
from protocol import native

native_records: Any = native.load("broker.store._records")


def filled(root: Path, count: int, units_per_segment: int = 10, first: int = 0) -> ConsumeQueue:
    queue = ConsumeQueue(root, "t", 0, units_per_segment)
    for queue_offset in range(first, first + count):
        assert queue.append(1000 + queue_offset * 100, 100, queue_offset, queue_offset)
    return queue


def test_files_are_named_by_their_start_byte_offset(tmp_path: Path) -> None:
    queue = filled(tmp_path, 25)
    names = sorted(p.name for p in (tmp_path / "t" / "0").iterdir())
    assert names == [f"{n * 10 * UNIT_BYTES:020d}" for n in range(3)]
    assert (queue.min_offset, queue.max_offset, queue.max_commit_log_end) == (0, 25, 1000 + 25 * 100)
    queue.close()


def test_read_units_never_crosses_a_file(tmp_path: Path) -> None:
    queue = filled(tmp_path, 25)
    units = queue.read_units(7, 100)
    assert units is not None
    assert [u[0] for u in CQ_UNIT.iter_unpack(units)] == [1700, 1800, 1900]
    units = queue.read_units(20, 100)          # last file: up to the written end
    assert units is not None and len(units) == 5 * UNIT_BYTES
    assert queue.read_units(30, 1) is None       # no file there
    assert queue.unit_at(24) == (3400, 100, 24) and queue.unit_at(25) is None
    queue.close()


def test_duplicates_are_skipped(tmp_path: Path) -> None:
    queue = filled(tmp_path, 5)
    assert not queue.append(1, 2, 3, 4)
    assert queue.unit_at(4) == (1400, 100, 4) and queue.max_offset == 5
    queue.close()


def test_reload_finds_max_even_with_zero_tags_and_offsets(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "t", 0, 10)
    for queue_offset in range(13):
        queue.append(0 if queue_offset == 0 else queue_offset * 50, 50, 0, queue_offset)
    queue.close()
    again = ConsumeQueue(tmp_path, "t", 0, 10)
    again.load()
    assert (again.min_offset, again.max_offset, again.max_commit_log_end) == (0, 13, 650)
    again.close()


def test_first_unit_at_a_later_offset_prefills_blanks_and_sets_min(tmp_path: Path) -> None:
    queue = filled(tmp_path, 3, first=14)
    assert (queue.min_offset, queue.max_offset) == (14, 17)
    queue.close()
    again = ConsumeQueue(tmp_path, "t", 0, 10)
    again.load()
    assert (again.min_offset, again.max_offset) == (14, 17)
    again.close()


def test_truncate_from_commit_log_offset_drops_the_tail(tmp_path: Path) -> None:
    queue = filled(tmp_path, 25)
    queue.truncate_from_commit_log_offset(1000 + 12 * 100)
    assert queue.max_offset == 12 and queue.max_commit_log_end == 1000 + 12 * 100
    assert queue.read_units(20, 1) is None       # the third file is gone
    assert queue.append(5, 6, 7, 12) and queue.unit_at(12) == (5, 6, 7)
    queue.close()
    again = ConsumeQueue(tmp_path, "t", 0, 10)
    again.load()
    assert again.max_offset == 13
    again.truncate_from_commit_log_offset(0)
    assert (again.min_offset, again.max_offset, again.max_commit_log_end) == (0, 0, 0)
    again.close()


def test_correct_min_offset_skips_units_before_the_commit_log(tmp_path: Path) -> None:
    queue = filled(tmp_path, 25)
    queue.correct_min_offset(1000 + 7 * 100 + 1)
    assert queue.min_offset == 8
    queue.close()


@pytest.mark.parametrize("topic", ["..", "a/b", "a.b", "", "x y", "ü"])
def test_unsafe_topic_names_are_refused(tmp_path: Path, topic: str) -> None:
    with pytest.raises(ValueError):
        ConsumeQueue(tmp_path, topic, 0, 10)
    with pytest.raises(ValueError):
        ConsumeQueueTable(tmp_path, 10).get_or_create(topic, 0)
    assert not any(tmp_path.iterdir())


def test_table_loads_directories_and_creates_nothing_for_reads(tmp_path: Path) -> None:
    filled(tmp_path, 3).close()
    (tmp_path / "bad.name").mkdir()
    table = ConsumeQueueTable(tmp_path, 10)
    table.load()
    assert list(table.queues) == [("t", 0)] and table.get("t", 1) is None
    assert not (tmp_path / "t" / "1").exists()
    table.close()


def test_reload_sees_units_written_after_a_hole(tmp_path: Path) -> None:
    queue = filled(tmp_path, 3, units_per_segment=1000)
    queue.close()
    with open(tmp_path / "t" / "0" / f"{0:020d}", "r+b") as file:   # a unit whose earlier page was lost
        file.seek(700 * UNIT_BYTES)
        file.write(CQ_UNIT.pack(99_000, 100, 0))
    again = ConsumeQueue(tmp_path, "t", 0, 1000)
    again.load()
    assert again.max_offset == 701 and again.unit_at(5) == (0, 0, 0)
    again.truncate_from_commit_log_offset(50_000)                     # recovery drops it and the hole
    assert again.max_offset == 3
    again.close()
    third = ConsumeQueue(tmp_path, "t", 0, 1000)
    third.load()
    assert third.max_offset == 3
    third.close()


in_range_units = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
                                    st.integers(-(2**63), 2**63 - 1)), max_size=40)


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
@given(units=in_range_units, position=st.integers(0, 40))
def test_c_writes_a_run_of_units_as_python_does(units: list[tuple[int, int, int]], position: int) -> None:
    size = position + len(units) * UNIT_BYTES
    by_c, by_python = bytearray(b"\xee" * (size + 3)), bytearray(b"\xee" * (size + 3))
    assert native_records.write_units(by_c, position, units) is True
    write_units_py(by_python, position, units)
    assert by_c == by_python
    assert not native_records.write_units(by_c, position + 4, units) or not units   # past the end: Python's


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
@pytest.mark.parametrize("size, position", [(0, 5), (20, 21), (100, 101)])
def test_a_position_past_the_buffer_is_left_to_python_even_for_no_units(size: int, position: int) -> None:
    # (found by the C-against-Python fuzz: C said True for an empty run past the end, struct raises)
    assert native_records.write_units(bytearray(size), position, []) is False
    with pytest.raises(struct.error):
        write_units(bytearray(size), position, [])


@pytest.mark.skipif(native_records is None, reason="broker.store._records was not built (no C compiler?)")
@pytest.mark.parametrize("unit", [(-1, 0, 0), (2**64, 0, 0), (0, 2**32, 0), (0, -1, 0), (0, 0, 2**63), (1, 2),
                                  [1, 2, 3], (1.0, 2, 3), (True, 2, 3)])
def test_unusual_units_are_left_to_python(unit: Any) -> None:
    buffer = bytearray(100)
    assert native_records.write_units(buffer, 0, [(1, 2, 3), unit]) is False
    assert buffer == bytearray(100)     # nothing written, not even the usual unit before it (as struct)
    try:
        write_units_py(bytearray(100), 0, [(1, 2, 3), unit])
    except (struct.error, TypeError) as exc:
        expected: Any = type(exc)
    else:
        expected = None
    try:
        write_units(buffer, 0, [(1, 2, 3), unit])
    except (struct.error, TypeError) as exc:
        assert type(exc) is expected
    else:
        assert expected is None
