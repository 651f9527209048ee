"""Property tests for the pure POP state (`broker.pop.state`) and receipt handles: any sequence of
pops, acks, changes, expiries and DLQ decisions keeps every popped offset in exactly one place
(in flight, revived, or done), the per-queue bound, the FIFO gate, stale handles refused, and
deliveries capped at retry_max_times + 1; snapshots and handles round-trip."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.pop.handle import ReceiptHandle
from broker.pop.state import QueuePopState, ReviveDecision, revive_decision

OPS = st.lists(st.tuples(st.sampled_from(["pop", "ack", "stale_ack", "change", "tick"]),
                         st.integers(0, 40), st.integers(1, 8)), max_size=120)


def run(ops: list[tuple[str, int, int]], fifo: bool, bound: int, retry_max: int, max_offset: int = 60) -> None:
    state = QueuePopState(0)
    now, ck = 0, 1
    done: set[int] = set()
    attempts: dict[int, int] = {}
    handles: dict[int, int] = {}            # offset -> the ck_id of its current handle
    for op, a, b in ops:
        if op == "pop":
            was_blocked = fifo and bool(state.in_flight)
            again, room = state.plan(b, fifo, bound)
            if was_blocked:
                assert again == [] and room == 0
            if fifo and again:
                assert room == 0 and [o for o, _ in again] == sorted(state.revived)[:b]
            new = list(range(state.next_offset, min(state.next_offset + room, max_offset)))
            handed = again + [(o, 0) for o in new]
            assert len(handed) <= b
            assert not any(o in done for o, _ in handed)
            state.hand_out(handed, ck, now + 10 * b, state.next_offset + len(new))
            for o, r in handed:
                attempts[o] = attempts.get(o, 0) + 1
                assert r == attempts[o] - 1
                handles[o] = ck
            ck += 1
        elif op in ("ack", "stale_ack") and state.in_flight:
            offset = sorted(state.in_flight)[a % len(state.in_flight)]
            if op == "stale_ack":
                assert not state.ack(offset, handles[offset] + 1000)
                assert offset in state.in_flight
            else:
                assert state.ack(offset, handles[offset])
                done.add(offset)
                assert not state.ack(offset, handles[offset])       # twice: stale
        elif op == "change" and state.in_flight:
            offset = sorted(state.in_flight)[a % len(state.in_flight)]
            assert state.change(offset, handles[offset], ck, now + a)
            assert not state.change(offset, handles[offset], ck + 1, now)    # the old handle is stale now
            handles[offset] = ck
            ck += 1
        elif op == "tick":
            now += a
            for offset, entry in state.expired(now):
                if revive_decision(entry.reconsume_times, retry_max) is ReviveDecision.DLQ:
                    assert state.drop(offset, entry.ck_id)
                    done.add(offset)
                else:
                    assert state.revive(offset, entry.ck_id) == entry.reconsume_times + 1
                assert state.current(offset, entry.ck_id) is None          # its handle is stale now
        # invariants
        assert not (set(state.in_flight) & set(state.revived))
        assert not (set(state.in_flight) | set(state.revived)) & done
        assert set(state.in_flight) | set(state.revived) | done == set(range(state.next_offset))
        assert state.held_count <= bound
        assert all(e.deadline_ms >= state.earliest_ms for e in state.in_flight.values())
        assert all(n <= retry_max + 1 for n in attempts.values())
        assert QueuePopState.from_json(state.to_json()) == state


@settings(max_examples=300, deadline=None)
@given(OPS, st.booleans(), st.integers(1, 12), st.integers(0, 4))
def test_any_sequence_keeps_the_pop_invariants(ops: list[tuple[str, int, int]], fifo: bool, bound: int,
                                              retry_max: int) -> None:
    run(ops, fifo, bound, retry_max)


@given(st.integers(0, 40), st.integers(0, 40))
def test_revive_decision_allows_retry_max_times_redeliveries(reconsume_times: int, retry_max: int) -> None:
    decision = revive_decision(reconsume_times, retry_max)
    assert (decision is ReviveDecision.DLQ) == (reconsume_times >= retry_max)


@given(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(1, 2**40),
       st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True), st.integers(0, 1023), st.integers(0, 2**62))
def test_receipt_handles_round_trip(ck_id: int, pop_at_ms: int, invisible_ms: int, broker_name: str,
                                    queue_id: int, queue_offset: int) -> None:
    handle = ReceiptHandle(ck_id, pop_at_ms, invisible_ms, broker_name, queue_id, queue_offset)
    assert ReceiptHandle.parse(handle.encode()) == handle


@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_as_malformed(text: str) -> None:
    from protocol.errors import SystemError_
    try:
        ReceiptHandle.parse(text)
    except SystemError_ as exc:
        assert "malformed receipt handle" in str(exc)
