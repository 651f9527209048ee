"""ProcessQueue bookkeeping against RocketMQ's `ProcessQueue` (REFERENCE.md §12, §11)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from client.consumer.process_queue import ProcessQueue
from protocol.message import PROPERTY_MAX_OFFSET, MessageExt


def msg(queue_offset: int, body: bytes = b"x", properties: dict[str, str] | None = None) -> MessageExt:
    return MessageExt(topic="t", body=body, queue_offset=queue_offset, properties=properties or {})


def msgs(*offsets: int) -> list[MessageExt]:
    return [msg(o, b"x" * (o % 7 + 1)) for o in offsets]


def test_new_queue_is_empty_and_stamped() -> None:
    pq = ProcessQueue(now_ms=1_000)
    assert (pq.msg_count, pq.msg_size_bytes, pq.max_span, pq.queue_offset_max) == (0, 0, 0, 0)
    assert not pq.dropped and not pq.locked and not pq.consuming and not pq.has_temp_message()
    assert pq.last_pull_at_ms == pq.last_consume_at_ms == 1_000


def test_remove_commits_the_lowest_unconsumed_offset() -> None:
    pq = ProcessQueue(now_ms=0)
    batch = msgs(10, 11, 12, 13)
    pq.put_messages(batch)
    # 11 and 12 consumed first: 10 is still outstanding, so the committed offset stays at 10
    assert pq.remove_messages([batch[1], batch[2]]) == 10
    assert pq.remove_messages([batch[0]]) == 13
    assert pq.remove_messages([batch[3]]) == 14          # nothing left: queue_offset_max + 1
    assert pq.remove_messages([batch[3]]) == -1          # already empty
    assert pq.msg_count == 0 and pq.msg_size_bytes == 0


def test_remove_ignores_messages_not_cached_and_stamps_consume_time() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages(msgs(5, 6))
    assert pq.remove_messages(msgs(99), now_ms=42) == 5
    assert pq.msg_count == 2 and pq.last_consume_at_ms == 42
    assert pq.remove_messages([], now_ms=43) == 5


def test_duplicates_by_offset_are_not_counted() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages([msg(1, b"abc"), msg(2, b"de")])
    pq.put_messages([msg(2, b"zzzzzz"), msg(3, b"f")])
    assert pq.msg_count == 3
    assert pq.msg_size_bytes == 3 + 2 + 1                # body bytes only; the first copy kept
    assert pq.queue_offset_max == 3
    assert pq.remove_messages([msg(2)]) == 1
    assert pq.msg_size_bytes == 3 + 1


def test_span_and_out_of_order_puts() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages(msgs(100, 105))
    pq.put_messages(msgs(102, 99))
    assert pq.max_span == 105 - 99 and pq.queue_offset_max == 105
    pq.remove_messages(msgs(99, 105))
    assert pq.max_span == 102 - 100
    pq.remove_messages(msgs(100, 102))
    assert pq.max_span == 0


def test_dispatch_to_consume_only_when_not_consuming() -> None:
    pq = ProcessQueue(now_ms=0)
    assert pq.put_messages([]) is False                  # empty cache: nothing to dispatch
    assert pq.put_messages(msgs(1)) is True and pq.consuming
    assert pq.put_messages(msgs(2)) is False
    assert len(pq.take_messages(10)) == 2
    assert pq.take_messages(10) == [] and not pq.consuming
    assert pq.put_messages(msgs(3)) is True


def test_msg_acc_cnt_from_max_offset_property() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages([msg(1), msg(2, properties={PROPERTY_MAX_OFFSET: "10"})])
    assert pq.msg_acc_cnt == 8
    pq.put_messages([msg(10, properties={PROPERTY_MAX_OFFSET: "10"})])
    assert pq.msg_acc_cnt == 8                           # not positive: kept


def test_orderly_take_commit() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages(msgs(4, 5, 6, 7))
    taken = pq.take_messages(2, now_ms=9)
    assert [m.queue_offset for m in taken] == [4, 5] and pq.last_consume_at_ms == 9
    assert pq.msg_count == 4                             # counted until commit
    assert pq.has_temp_message()
    assert pq.commit() == 6
    assert pq.msg_count == 2 and pq.msg_size_bytes == sum(len(m.body) for m in msgs(6, 7))
    assert pq.commit() == -1                             # nothing taken


def test_commit_keeps_the_messages_asked_to_stay_taken() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages(msgs(1, 2, 3, 4, 5))
    taken = pq.take_messages(4)
    assert pq.commit(keep=taken[2:]) == 3                # 1 and 2 forgotten, 3 and 4 still taken
    assert pq.msg_count == 3 and pq.msg_size_bytes == sum(len(m.body) for m in msgs(3, 4, 5))
    pq.make_messages_to_consume_again(taken[2:])         # they are still taken: put back
    assert [m.queue_offset for m in pq.take_messages(5)] == [3, 4, 5]
    assert pq.commit(keep=msgs(9)) == 6                  # an untaken message to keep is ignored
    assert pq.msg_count == 0 and pq.commit(keep=taken) == -1


@given(st.sets(st.integers(0, 200), min_size=1, max_size=40), st.integers(0, 40))
def test_commit_keeping_a_suffix_matches_a_reference_model(offsets: set[int], kept_count: int) -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages(msgs(*sorted(offsets)))
    taken = pq.take_messages(len(offsets))
    keep = taken[len(taken) - min(kept_count, len(taken)):]
    committed = taken[:len(taken) - len(keep)]
    assert pq.commit(keep=keep) == (committed[-1].queue_offset + 1 if committed else -1)
    assert pq.msg_count == len(keep) and pq.msg_size_bytes == sum(len(m.body) for m in keep)
    assert pq.commit() == (keep[-1].queue_offset + 1 if keep else -1)   # the kept ones were still taken
    assert pq.msg_count == 0 and pq.msg_size_bytes == 0


def test_orderly_consume_again_puts_messages_back_in_order() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages(msgs(1, 2, 3))
    first = pq.take_messages(2)
    pq.make_messages_to_consume_again(first)
    assert pq.msg_count == 3 and pq.commit() == -1
    assert [m.queue_offset for m in pq.take_messages(3)] == [1, 2, 3]
    assert pq.commit() == 4
    assert pq.msg_count == 0 and pq.msg_size_bytes == 0 and not pq.has_temp_message()


def test_consume_again_ignores_untaken_and_counts_a_recached_offset_once() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages(msgs(1, 2))
    taken = pq.take_messages(1)
    pq.make_messages_to_consume_again(msgs(2, 50))       # not taken: ignored
    pq.put_messages(msgs(1))                             # offset 1 re-pulled while being consumed
    pq.make_messages_to_consume_again(taken)
    assert pq.msg_count == 2 and pq.msg_size_bytes == sum(len(m.body) for m in msgs(1, 2))
    assert pq.take_messages(5)[0] is taken[0]


def test_expiry() -> None:
    pq = ProcessQueue(now_ms=1_000)
    assert not pq.is_pull_expired(121_000)
    assert pq.is_pull_expired(121_001)
    assert pq.is_pull_expired(2_000, max_idle_ms=500)
    pq.last_lock_at_ms = 5_000
    assert not pq.is_lock_expired(35_000)
    assert pq.is_lock_expired(35_001)


def test_clear() -> None:
    pq = ProcessQueue(now_ms=0)
    pq.put_messages(msgs(1, 2, 3))
    pq.take_messages(1)
    pq.clear()
    assert (pq.msg_count, pq.msg_size_bytes, pq.queue_offset_max, pq.max_span) == (0, 0, 0, 0)
    assert pq.commit() == -1 and pq.remove_messages(msgs(2)) == -1


@given(st.lists(st.lists(st.integers(0, 200), max_size=32), min_size=1, max_size=8), st.randoms())
def test_remove_matches_a_reference_model(batches: list[list[int]], rng: random.Random) -> None:
    pq = ProcessQueue(now_ms=0)
    cached: dict[int, int] = {}
    for batch in batches:
        pq.put_messages(msgs(*batch))
        for o in batch:
            cached.setdefault(o, o % 7 + 1)
    offset_max = max(o for batch in batches for o in batch) if any(batches) else 0
    assert pq.msg_count == len(cached) and pq.msg_size_bytes == sum(cached.values())
    assert pq.max_span == (max(cached) - min(cached) if cached else 0)
    pending = list(cached)
    rng.shuffle(pending)
    committed = -1
    while pending:
        chunk, pending = pending[:3], pending[3:]
        result = pq.remove_messages(msgs(*chunk))
        for o in chunk:
            del cached[o]
        assert result == (min(cached) if cached else offset_max + 1)
        assert result >= committed                       # the commit point never moves back
        committed = result
    assert pq.msg_count == 0 and pq.msg_size_bytes == 0
