"""`Coalescer` (the transaction producer's request batching), as a property: whatever calls are
ready in whichever loop steps, with whatever per-item or whole-run failures and completion order,
every call is resolved exactly once with its own result (its future's, for a submitted one, and
`on_done`'s for every one, posted calls too); runs keep one key, submit order, and their bounds;
calls ready in one step share a run unless a bound cut it; and a cut run is sent inside the call
that cut it (eagerly, not on a later loop step)."""

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
    posted: bool    # `post` (no future: only `on_done` sees its outcome), else `submit`


@dataclass
class Runs:
    seen: list[tuple[str, list[Call]]] = field(default_factory=list)


calls_in_a_step = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 9),
                                     st.sampled_from([OK, OK, OK, ITEM_ERROR, RUN_ERROR]), st.integers(0, 3),
                                     st.booleans()),
                           max_size=12)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(calls_in_a_step, st.integers(0, 3)), min_size=1, max_size=6),
       max_items=st.integers(1, 6), max_bytes=st.integers(1, 30))
def test_every_call_resolved_once_with_its_own_result(
        steps: list[tuple[list[tuple[str, int, str, int, bool]], int]], max_items: int, max_bytes: int) -> None:
    runs = Runs()
    outcomes: dict[int, list[int | BaseException]] = {}

    async def send(key: str, items: list[Call]) -> list[int | BaseException]:
        runs.seen.append((key, list(items)))
        for _ in range(max(item.delay for item in items)):
            await asyncio.sleep(0)
        if any(item.mode == RUN_ERROR for item in items):
            raise RunFailed(key)
        return [ItemFailed(item.index) if item.mode == ITEM_ERROR else item.index * 10 for item in items]

    async def scenario() -> list[tuple[Call, asyncio.Future[int] | None]]:
        coalescer: Coalescer[str, Call, int] = Coalescer(
            send, max_items=max_items, max_bytes=max_bytes, size=lambda call: call.size,
            on_done=lambda call, outcome: outcomes.setdefault(call.index, []).append(outcome))
        submitted: list[tuple[Call, asyncio.Future[int] | None]] = []
        for step, (calls, gap) in enumerate(steps):
            for key, size, mode, delay, posted in calls:     # all in one loop step: no await between them
                call = Call(step, len(submitted), key, size, mode, delay, posted)
                if posted:
                    coalescer.post(key, call)
                    submitted.append((call, None))
                else:
                    submitted.append((call, coalescer.submit(key, call)))
                assert len(runs.seen) == coalescer.requests, "a run cut by this call was sent inside it"
            for _ in range(gap):
                await asyncio.sleep(0)
        deadline = asyncio.get_running_loop().time() + 10
        while len(outcomes) < len(submitted) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0)
        return submitted

    submitted = asyncio.run(scenario())
    assert all(future.done() for _, future in submitted if future is not None), "every submitted call resolved"
    assert sorted(outcomes) == [call.index for call, _ in submitted], "on_done saw every call"
    assert all(len(seen) == 1 for seen in outcomes.values()), "on_done saw each call once"
    run_of = {call.index: items for _, items in runs.seen for call in items}
    assert sorted(run_of) == [call.index for call, _ in submitted], "every call sent exactly once"
    for call, future in submitted:
        run = run_of[call.index]
        outcome = outcomes[call.index][0]
        if future is not None:
            assert future.exception() is outcome if future.exception() else future.result() == outcome
        if any(item.mode == RUN_ERROR for item in run):
            assert isinstance(outcome, RunFailed)
        elif call.mode == ITEM_ERROR:
            assert isinstance(outcome, ItemFailed) and outcome.args == (call.index,), "its own error"
        else:
            assert outcome == call.index * 10, "its own result"
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
    await asyncio.sleep(0)      # the flush (call_soon) runs: the request goes out inside it
    assert sent == [[7]]
    assert await future == 7


async def test_a_run_cut_by_a_bound_goes_out_inside_the_call_that_cut_it() -> None:
    sent: list[list[int]] = []

    async def send(key: str, items: list[int]) -> list[int]:
        sent.append(items)
        await asyncio.sleep(0)
        return items

    coalescer: Coalescer[str, int, int] = Coalescer(send, max_items=2, max_bytes=100, size=lambda _: 1)
    first, second = coalescer.submit("k", 1), coalescer.submit("k", 2)
    assert sent == [[1, 2]], "sent before the loop ran again"
    third = coalescer.submit("k", 3)
    assert sent == [[1, 2]]
    assert [await first, await second, await third] == [1, 2, 3]
    assert sent == [[1, 2], [3]]


async def test_post_needs_on_done() -> None:
    async def send(key: str, items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError):
        Coalescer(send, max_items=8, max_bytes=100, size=lambda _: 1).post("k", 1)


def test_bounds_must_be_positive() -> None:
    async def send(key: str, items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError):
        Coalescer(send, max_items=0, max_bytes=1, size=lambda _: 1)
