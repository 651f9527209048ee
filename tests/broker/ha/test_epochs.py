"""`consistent_offset` against logs built as epochs go: a common history, then the deposed
master's unreplicated tail in its last epoch while the new master starts epochs of its own."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from broker.ha.epochs import EpochFile, consistent_offset


@given(st.lists(st.integers(1, 500), min_size=1, max_size=6), st.integers(0, 500), st.integers(0, 500),
       st.lists(st.integers(0, 500), max_size=4), st.booleans())
def test_consistent_offset_is_the_branch_point(common_lengths: list[int], slave_tail: int, master_gap: int,
                                               later: list[int], slave_ahead: bool) -> None:
    entries, offset = [], 0
    for epoch, length in enumerate(common_lengths, start=1):
        entries.append((epoch, offset))
        offset += length
    branch = offset                     # the slave (deposed master) went on in its last epoch
    slave_end = branch + (slave_tail if slave_ahead else 0)
    # the new master had the log only up to `branch - master_gap` when elected
    elected_at = max(entries[-1][1], branch - master_gap)
    master = [*entries, (len(entries) + 1, elected_at)]
    master_end = elected_at
    for extra in later:
        master_end += extra
    expected = min(elected_at, slave_end)
    assert consistent_offset(master, master_end, entries, slave_end) == expected
    # a slave that followed the master all along (same entries): its own end
    assert consistent_offset(master, master_end, master, min(master_end, slave_end)) == min(master_end, slave_end)


def test_no_shared_epoch() -> None:
    assert consistent_offset([(2, 0)], 10, [(1, 0)], 5) is None
    assert consistent_offset([], 10, [(1, 0)], 5) is None


def test_epoch_file_begin_adopt_reload(tmp_path: Path) -> None:
    path = tmp_path / "epochs"
    epochs = EpochFile(path)
    assert epochs.last_epoch == 0
    epochs.begin(1, 0)
    epochs.begin(3, 500)
    assert EpochFile(path).entries == [(1, 0), (3, 500)]
    assert epochs.adopt([(1, 0), (3, 500), (4, 900)], 600) is True
    assert epochs.adopt([(1, 0), (3, 500), (4, 900)], 900) is False
    assert EpochFile(path).entries == [(1, 0), (3, 500), (4, 900)]
    epochs.begin(2, 100)          # an older epoch (a stale decision) replaces what follows it
    assert epochs.entries == [(1, 0), (2, 100)]
