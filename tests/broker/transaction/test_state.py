"""`TransactionTable` (pure): the pending half messages are exactly those with no "d" op record,
whatever the order the half and op records are read in; check counts follow the "c" records."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.transaction.state import HalfState, TransactionTable


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, int, list[tuple[str, int]], set[int], dict[int, int]]:
    """(base, half count, records in a shuffled order, removed offsets, checks per offset)."""
    base = draw(st.integers(0, 50))
    count = draw(st.integers(0, 40))
    offsets = list(range(base, base + count))
    removed = set(draw(st.lists(st.sampled_from(offsets), unique=True))) if offsets else set()
    checks = {o: draw(st.integers(0, 3)) for o in offsets} if offsets else {}
    records: list[tuple[str, int]] = [("half", o) for o in offsets]
    records += [("d", o) for o in removed]
    records += [("d", o) for o in draw(st.lists(st.sampled_from(sorted(removed)), max_size=5))] if removed else []
    records += [("c", o) for o, n in checks.items() for _ in range(n) if o not in removed]
    records += [("d", draw(st.integers(0, base - 1)))] if base and draw(st.booleans()) else []   # below base: ignored
    return base, count, draw(st.permutations(records)), removed, checks


@settings(max_examples=300, deadline=None)
@given(histories())
def test_pending_is_halves_without_a_removal_in_any_order(history: tuple[int, int, list[tuple[str, int]],
                                                                        set[int], dict[int, int]]) -> None:
    base, count, records, removed, checks = history
    table = TransactionTable(base=base)
    for kind, offset in records:
        if kind == "half":
            table.add_half(offset, commit_log_offset=offset * 100, stored_at_ms=offset)
        elif kind == "d":
            table.remove(offset)
        else:
            table.checked(offset)
    expected = set(range(base, base + count)) - removed
    assert set(table.pending) == expected
    for offset in expected:
        assert table.state(offset) is HalfState.PENDING
        assert table.pending[offset].checks == checks[offset]
        assert table.pending[offset].commit_log_offset == offset * 100
    for offset in removed:
        assert table.state(offset) is HalfState.RESOLVED
    assert table.state(base + count + 5) is HalfState.UNKNOWN
    if base:
        assert table.state(base - 1) is HalfState.UNKNOWN
    # nothing is kept for resolved halves once every record is in
    assert not table._early_removed and not table._early_checks and not table._gaps


@given(st.lists(st.integers(0, 1_000), max_size=30), st.integers(0, 1_000), st.integers(0, 500))
def test_due_is_the_pending_halves_past_the_timeout_oldest_offset_first(stored: list[int], now: int,
                                                                        timeout: int) -> None:
    table = TransactionTable()
    for offset, stored_at in enumerate(stored):
        table.add_half(offset, offset, stored_at)
    due = table.due(now, timeout, limit=10)
    expected = [o for o, at in enumerate(stored) if now - at >= timeout][:10]
    assert due == expected


def test_a_late_half_after_its_removal_is_not_pending_and_a_duplicate_half_is_ignored() -> None:
    table = TransactionTable()
    table.remove(2)
    assert table.state(2) is HalfState.UNKNOWN
    assert table.add_half(0, 0, 0) and table.add_half(1, 1, 0)
    assert not table.add_half(2, 2, 0)
    assert table.state(2) is HalfState.RESOLVED
    assert not table.add_half(1, 1, 0), "a duplicate half"
    assert table.remove(1) and not table.remove(1)
    assert set(table.pending) == {0}
