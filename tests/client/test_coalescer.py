"""`Coalescer` (the transaction producer's request batching), as a property: whatever calls are
ready in whichever loop steps, with whatever per-item or whole-run failures and completion order,
every call is resolved exactly once with its own result; runs keep one key, submit order, and
their bounds; and calls ready in one step share a run unless a bound cut it."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.producer.coalescer import Coalescer

OK, ITEM_ERROR, RUN_ERROR = "ok", "item_error", "run_error"


class ItemFailed(Exception):
    pass


class RunFailed(Exception):
    pass


@dataclass(frozen=True)
class Call:
    step: int
    index: int
    key: str
    size: int
    mode: str
    delay: int      # loop iterations its run's send waits (the largest of the run's)


@dataclass
class Runs:
    seen: list[tuple[str, list[Call]]] = field(default_factory=list)


calls_in_a_step = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 9),
                                     st.sampled_from([OK, OK, OK, ITEM_ERROR, RUN_ERROR]), st.integers(0, 3)),
                           max_size=12)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(calls_in_a_step, st.integers(0, 3)), min_size=1, max_size=6),
       max_items=st.integers(1, 6), max_bytes=st.integers(1, 30))
def test_every_call_resolved_once_with_its_own_result(steps: list[tuple[list[tuple[str, int, str, int]], int]],
                                                      max_items: int, max_bytes: int) -> None:
    runs = Runs()

    async def send(key: str, items: list[Call]) -> list[int | BaseException]:
        runs.seen.append((key, list(items)))
        for _ in range(max(item.delay for item in items)):
            await asyncio.sleep(0)
        if any(item.mode == RUN_ERROR for item in items):
            raise RunFailed(key)
        return [ItemFailed(item.index) if item.mode == ITEM_ERROR else item.index * 10 for item in items]

    async def scenario() -> list[tuple[Call, asyncio.Future[int]]]:
        coalescer: Coalescer[str, Call, int] = Coalescer(send, max_items=max_items, max_bytes=max_bytes,
                                                         size=lambda call: call.size)
        submitted: list[tuple[Call, asyncio.Future[int]]] = []
        for step, (calls, gap) in enumerate(steps):
            for key, size, mode, delay in calls:     # all in one loop step: no await between them
                call = Call(step, len(submitted), key, size, mode, delay)
                submitted.append((call, coalescer.submit(key, call)))
            for _ in range(gap):
                await asyncio.sleep(0)
        if submitted:
            await asyncio.wait([future for _, future in submitted], timeout=10)
        return submitted

    submitted = asyncio.run(scenario())
    assert all(future.done() for _, future in submitted), "every call resolved"
    run_of = {call.index: items for _, items in runs.seen for call in items}
    assert sorted(run_of) == [call.index for call, _ in submitted], "every call sent exactly once"
    for call, future in submitted:
        run = run_of[call.index]
        if any(item.mode == RUN_ERROR for item in run):
            assert isinstance(future.exception(), RunFailed)
        elif call.mode == ITEM_ERROR:
            error = future.exception()
            assert isinstance(error, ItemFailed) and error.args == (call.index,), "its own error"
        else:
            assert future.result() == call.index * 10, "its own result"
    for key, items in runs.seen:
        assert {item.key for item in items} == {key}
        assert 1 <= len(items) <= max_items
        assert len(items) == 1 or sum(item.size for item in items) <= max_bytes
    for key in "abc":
        in_order = [item.index for k, items in runs.seen if k == key for item in items]
        assert in_order == sorted(in_order), "a key's calls go in submit order"
        key_runs = [items for k, items in runs.seen if k == key]
        for earlier, later in itertools.pairwise(key_runs):
            if earlier[-1].step == later[0].step:       # one step split in two: only by a bound
                total = sum(item.size for item in earlier)
                assert (len(earlier) == max_items or total >= max_bytes
                        or total + later[0].size > max_bytes), (earlier, later)


async def test_a_lone_call_goes_out_in_the_next_loop_iteration() -> None:
    sent: list[list[int]] = []

    async def send(key: str, items: list[int]) -> list[int]:
        sent.append(items)
        return items

    coalescer: Coalescer[str, int, int] = Coalescer(send, max_items=8, max_bytes=100, size=lambda _: 1)
    future = coalescer.submit("k", 7)
    assert sent == []
    await asyncio.sleep(0)      # the flush (call_soon) runs, its task is created
    await asyncio.sleep(0)      # the task's first step: the request goes out
    assert sent == [[7]]
    assert await future == 7


def test_bounds_must_be_positive() -> None:
    async def send(key: str, items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError):
        Coalescer(send, max_items=0, max_bytes=1, size=lambda _: 1)
