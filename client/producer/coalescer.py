"""`Coalescer`: calls made in the same event-loop step, per key, sent as one request (group commit
for requests). The transaction producer sends the half messages of concurrent transactions as one
SEND_BATCH_MESSAGE and their ends as one END_TRANSACTION_BATCH this way.

Nothing waits for a timer (no Nagle delay): the first call of a step schedules a flush with
`loop.call_soon`, which runs once every task made ready in that step has had its turn, so a lone
call goes out one loop iteration later, and concurrent ones share a request. A run is cut when it
reaches `max_items` or would pass `max_bytes`: the run so far goes out at once, the call starts the
next one.

A run's `send` is started eagerly (issue #38): its first step, up to its first real wait (for the
transaction producer, the request written to the connection), runs inside `_start` itself, and
only the rest runs in a task. So the first 64 half messages of a wave of 512 reach the broker
while this step still builds the others, where a task would have started them one loop iteration
later, after every other caller ready in this step. Python 3.12's eager tasks do this; 3.11 has
none, so `_resume` hands the started coroutine to an ordinary task. What `send` does before its
first wait must therefore not depend on running in a task of its own (no `asyncio.timeout`,
`current_task` there): it runs in the submitting caller's task."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Generic, TypeVar

K = TypeVar("K")
T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[K, T, R]):
    """`submit(key, item)` returns a future of the item's own result. `send(key, items)` sends a
    run of items of one key and returns one result per item, in order: a value, or an exception
    raised to that item's caller only; an exception `send` raises (or a result list of the wrong
    length) is raised to every caller of the run. Each future is resolved exactly once (one whose
    caller gave up, cancelled, is skipped). `size(item)` is counted against `max_bytes`.

    `post(key, item)` is `submit` without a future, for a caller that does not wait for its
    result: `on_done(item, outcome)` is called once for every item, posted or submitted, with its
    result (an exception, `asyncio.CancelledError` when the run was cancelled); it must not
    raise. A future, a done callback and a loop callback less per item: the transaction producer's
    ends cost ~2 µs less each this way."""

    def __init__(self, send: Callable[[K, list[T]], Awaitable[Sequence[R | BaseException]]], *, max_items: int,
                 max_bytes: int, size: Callable[[T], int],
                 on_done: Callable[[T, R | BaseException], None] | None = None) -> None:
        if max_items < 1 or max_bytes < 1:
            raise ValueError("max_items and max_bytes must be at least 1")
        self._send, self._size, self._on_done = send, size, on_done
        self.max_items, self.max_bytes = max_items, max_bytes
        self._runs: dict[K, tuple[list[T], list[asyncio.Future[R] | None], list[int]]] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0               # runs sent, for tests and metrics

    def submit(self, key: K, item: T) -> asyncio.Future[R]:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._add(key, item, future)
        return future

    def post(self, key: K, item: T) -> None:
        """`submit` whose outcome only `on_done` sees; `ValueError` when there is no `on_done`."""
        if self._on_done is None:
            raise ValueError("post needs an on_done callback")
        self._add(key, item, None)

    def _add(self, key: K, item: T, future: asyncio.Future[R] | None) -> None:
        size = self._size(item)
        run = self._runs.get(key)
        if run is not None and run[2][0] + size > self.max_bytes:
            del self._runs[key]         # this item would pass max_bytes: the run so far goes now
            self._start(key, run[0], run[1])
            run = None
        if run is None:
            run = self._runs[key] = ([], [], [0])
        items, futures, total = run
        items.append(item)
        futures.append(future)
        total[0] += size
        if len(items) >= self.max_items or total[0] >= self.max_bytes:
            del self._runs[key]
            self._start(key, items, futures)
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        runs, self._runs = self._runs, {}
        for key, (items, futures, _) in runs.items():
            self._start(key, items, futures)

    def _start(self, key: K, items: list[T], futures: list[asyncio.Future[R] | None]) -> None:
        self.requests += 1
        run = self._run(key, items, futures)
        try:
            waits_for = run.send(None)      # eager: the request goes out now (see the module's doc)
        except StopIteration:
            return                          # finished without waiting: every future is resolved
        task = asyncio.get_running_loop().create_task(_finish(run, waits_for))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: K, items: list[T], futures: list[asyncio.Future[R] | None]) -> None:
        try:
            results: Sequence[R | BaseException] = await self._send(key, items)
            if len(results) != len(items):
                raise RuntimeError(f"{len(results)} results for {len(items)} coalesced calls")
        except asyncio.CancelledError as cancelled:
            self._resolve(items, futures, [cancelled] * len(items))
            raise
        except Exception as exc:
            results = [exc] * len(items)
        self._resolve(items, futures, results)

    def _resolve(self, items: list[T], futures: list[asyncio.Future[R] | None],
                 results: Sequence[R | BaseException]) -> None:
        on_done = self._on_done
        for item, future, result in zip(items, futures, results, strict=True):
            if on_done is not None:
                on_done(item, result)
            if future is None or future.done():
                continue
            if isinstance(result, asyncio.CancelledError):
                future.cancel()
            elif isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

async def _finish(run: Coroutine[Any, Any, None], waits_for: Any) -> None:
    await _resume(run, waits_for)


@types.coroutine
def _resume(run: Coroutine[Any, Any, None], waits_for: Any) -> Generator[Any, Any, None]:
    """Drive `run`, whose first step was taken outside any task and yielded `waits_for` (a future
    still marked as awaited, or None), on to its end inside the task awaiting this: what `run`
    yields goes to the task, what the task sends or throws (a result, a cancellation) goes to
    `run`."""
    while True:
        try:
            sent = yield waits_for
        except GeneratorExit:
            run.close()
            raise
        except BaseException as exc:  # every exception (a cancellation too) goes to `run`
            try:
                waits_for = run.throw(exc)
            except StopIteration:
                return
        else:
            try:
                waits_for = run.send(sent)
            except StopIteration:
                return
