"""`ConcurrentConsumeService`: calls the listener for pulled messages with bounded concurrency
(RocketMQ `ConsumeMessageConcurrentlyService`, REFERENCE.md §9, §12).

A pulled batch is one consume job: its messages go to the listener in chunks of
`consume_message_batch_max_size`, one after another, and at most `consume_thread_max` jobs run at
once. A sync listener runs in a thread pool (the event loop never blocks); an async one is awaited.
One thread hop per pulled batch instead of per chunk keeps the hop cost off each message; the
results of the chunks called so far are applied on the loop at least every `REPORT_EVERY_S` of
listener work (RocketMQ applies each ConsumeRequest's as it ends), so the committed offset follows
a listener slower than the backlog call by call, whatever the batch size and thread count. Once
`close` (the start of a graceful stop) no chunk's call starts.

Results (RocketMQ `processConsumeResult`, REFERENCE.md §9): CONSUME_SUCCESS acknowledges the chunk
up to `context.ack_index`; RECONSUME_LATER, `None` or an exception acknowledges none of it. In
CLUSTERING the messages after the ack index are sent back to the broker (`SendBack`: send-back,
else a resend to the retry topic) with `context.delay_level_when_next_consume`; the ones the broker
took are removed from the process queue, the others stay (holding the committed offset) and are
consumed again locally after `reconsume_later_delay_ms` with `reconsume_times` + 1. BROADCASTING
drops failed messages with a log line. The offset advances to the queue's lowest unconsumed offset
(at-least-once).

Consume timeout (`clean_expired_messages`, RocketMQ `cleanExpireMsg`): a message whose listener
call started more than `consume_timeout_ms` ago is sent back with delay level 3 and removed from
its process queue, so one stuck listener call cannot pin the committed offset forever."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, cast

from client.consumer.listener import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ListenerResult,
    MessageListener,
)
from client.consumer.offset_store import OffsetUpdate
from client.consumer.process_queue import ProcessQueue
from client.consumer.sync_workers import SyncWorkers
from protocol.message import PROPERTY_CONSUME_START_TIME, MessageExt
from protocol.model import MessageModel, MessageQueue

log = logging.getLogger(__name__)
JobObserver = Callable[[str, int, float, float], None]
SendBackFn = Callable[[MessageExt, MessageQueue, int], Awaitable[bool]]   # (message, mq, delay_level)
SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
FAST_LISTENER_S = 50e-6
EXPIRED_HEAD_MESSAGES = 16             # cleanExpireMsg inspects at most 16 head messages per queue
EXPIRED_DELAY_LEVEL = 3
REPORT_EVERY_S = 0.01                  # finished listener calls reach the offset store at least this often
Chunk = list[MessageExt]
Outcome = tuple[int, int]              # (messages acknowledged from the chunk's start, delay level)
Job = tuple[ProcessQueue, MessageQueue, list[Chunk], float]     # a pulled batch: its chunks, when submitted
Finished = tuple[ProcessQueue, MessageQueue, list[Chunk], list[Outcome]]    # chunks called, their outcomes


def acked_count(status: object, context: ConsumeConcurrentlyContext, size: int) -> int:
    """How many of a chunk of `size` are consumed: `ack_index + 1` clamped to 0..size on
    CONSUME_SUCCESS, 0 for anything else (RECONSUME_LATER, None, a wrong type)."""
    if status is not SUCCESS:
        return 0
    return min(max(context.ack_index + 1, 0), size)


class ConcurrentConsumeService:
    def __init__(self, listener: MessageListener, *, consume_thread_max: int, batch_max_size: int,
                 reconsume_later_delay_ms: int, message_model: MessageModel, update_offset: OffsetUpdate,
                 consumer_group: str, send_back: SendBackFn | None = None, consume_timeout_ms: int = 15 * 60_000
                 ) -> None:
        self._listener = listener
        self._is_async = inspect.iscoroutinefunction(listener)
        self._batch_max_size = batch_max_size
        self._reconsume_later_delay_ms = reconsume_later_delay_ms
        self._message_model = message_model
        self._update_offset = update_offset
        self._group = consumer_group
        self._send_back = send_back
        self.consume_timeout_ms = consume_timeout_ms
        self._slots = asyncio.Semaphore(consume_thread_max)
        self._workers = SyncWorkers(consume_thread_max, f"consume-{consumer_group}")
        self._gathered: list[Job] = []
        self._loop = asyncio.get_running_loop()
        # EWMA, written by worker threads; it starts at the bound, so the first batches, pulled while
        # nothing is measured yet, are spread one job each: grouped as for a fast listener, a slow
        # one's first jobs ran ahead of the ones their thread handed back (#34's order)
        self.listener_seconds_per_message = FAST_LISTENER_S
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._closed = False
        self.consumed_ok = 0
        self.consumed_failed = 0
        self.expired = 0
        self.observe: JobObserver | None = None     # metrics: (topic, count, await_s, process_s) per job

    def submit(self, pq: ProcessQueue, mq: MessageQueue, messages: list[MessageExt]) -> None:
        """Start consuming `messages` (already in `pq`); returns at once."""
        if self._closed or not messages:
            return
        size = self._batch_max_size
        chunks = [[m] for m in messages] if size == 1 else [messages[i:i + size]
                                                             for i in range(0, len(messages), size)]
        submitted = time.perf_counter()
        if not self._is_async:
            self._gathered.append((pq, mq, chunks, submitted))
            if len(self._gathered) == 1:
                asyncio.get_running_loop().call_soon(self._hand_to_workers)
            return
        self._spawn(self._run_job(pq, mq, chunks, submitted))

    async def _run_job(self, pq: ProcessQueue, mq: MessageQueue, chunks: list[Chunk], submitted: float) -> None:
        async with self._slots:
            if pq.dropped or self._closed:
                return
            started = reported_at = time.perf_counter()
            done_from, results = 0, []
            listener = cast(Callable[[Chunk, ConsumeConcurrentlyContext], Awaitable[ListenerResult]], self._listener)
            for chunk in chunks:
                if self._closed or pq.dropped:
                    break
                _stamp_start(chunk)
                # The listener awaited inline (no coroutine frame of ours per chunk: with one
                # message per chunk, such a frame was a tenth of the consumer's CPU)
                context = ConsumeConcurrentlyContext(mq)
                try:
                    status = await listener(chunk, context)
                except Exception:
                    log.exception("listener of %s failed on %d messages of %s", self._group, len(chunk), mq)
                    results.append((0, context.delay_level_when_next_consume))
                else:
                    if status is SUCCESS and context.ack_index >= len(chunk) - 1:
                        results.append((len(chunk), 0))
                    else:
                        results.append((acked_count(status, context, len(chunk)),
                                        context.delay_level_when_next_consume))
                now = time.perf_counter()
                if now - reported_at >= REPORT_EVERY_S:     # the committed offset follows a slow listener
                    self._process_results(pq, mq, chunks[done_from:done_from + len(results)], results)
                    done_from, results, reported_at = done_from + len(results), [], now
            if self.observe is not None:
                self.observe(mq.topic, sum(map(len, chunks)), started - submitted, time.perf_counter() - started)
        if results:
            self._process_results(pq, mq, chunks[done_from:done_from + len(results)], results)

    def _hand_to_workers(self) -> None:
        """Give the batches gathered during one loop step to the worker threads. A thread hop costs
        ~100 µs of CPU here, so while the listener is fast (EWMA under `FAST_LISTENER_S` per
        message) they go as one job, queued behind a thread already running the listener if there
        is one (`SyncWorkers.submit(spread=False)`); a slow listener gets one job per batch, spread
        over threads."""
        jobs, self._gathered = self._gathered, []
        fast = self.listener_seconds_per_message < FAST_LISTENER_S
        self._submit_jobs(jobs, 1 if not fast else len(jobs), spread=not fast)

    def _submit_jobs(self, jobs: list[Job], step: int, *, spread: bool, front: bool = False) -> None:
        groups = [jobs[i:i + step] for i in range(0, len(jobs), step)]
        for group in reversed(groups) if front else groups:
            self._workers.submit(lambda group=group: self._sync_jobs(group), spread=spread,  # type: ignore[misc]
                                 front=front)

    def _sync_jobs(self, jobs: list[Job]) -> Callable[[], None]:
        """Runs in a worker thread: calls the listener chunk by chunk and returns the completion
        that applies what it has not reported yet on the loop. Finished chunks are reported to the
        loop at least every `REPORT_EVERY_S`, so the committed offset follows a slow listener call
        by call (once per run of a fast one). No call starts once the service closes or the queue
        is dropped. A job found slow (over `FAST_LISTENER_S` per message) hands the jobs after it
        back to be spread over the threads (a listener that turned slow in a fast group)."""
        finished: list[Finished] = []
        reported_at = time.perf_counter()
        observe = self.observe
        for index, (pq, mq, chunks, submitted) in enumerate(jobs):
            job_started = time.perf_counter()
            done_from, results = 0, []
            for chunk in chunks:
                if self._closed or pq.dropped:
                    break
                _stamp_start(chunk)
                results.append(self._call_sync(mq, chunk))
                now = time.perf_counter()
                if now - reported_at >= REPORT_EVERY_S:
                    finished.append((pq, mq, chunks[done_from:done_from + len(results)], results))
                    self._report(finished)
                    done_from, results, finished, reported_at = done_from + len(results), [], [], now
            if results:
                finished.append((pq, mq, chunks[done_from:done_from + len(results)], results))
            count = sum(map(len, chunks[:done_from + len(results)]))
            if not count:
                continue
            took = time.perf_counter() - job_started
            if observe is not None:
                observe(mq.topic, count, job_started - submitted, took)
            per_message = took / count
            self.listener_seconds_per_message += (per_message - self.listener_seconds_per_message) * 0.2
            if per_message >= FAST_LISTENER_S and index + 1 < len(jobs) and not self._closed:
                self._call_on_loop(self._spread_jobs, jobs[index + 1:])
                break
        return lambda: self._apply(finished)

    def _spread_jobs(self, jobs: list[Job]) -> None:
        """Jobs handed back by a thread that found the listener slow: spread, ahead of the jobs
        queued since (they were pulled earlier; behind newer pulls, one thread starved their
        queues' lowest offsets and the committed offsets stood still: #34, 160 of 598 committed)."""
        self._submit_jobs(jobs, 1, spread=True, front=True)

    def _report(self, finished: list[Finished]) -> None:
        """From a worker thread: apply `finished` on the loop now (before the job's completion)."""
        self._call_on_loop(self._apply, finished)

    def _call_on_loop(self, callback: Callable[[list[Any]], None], arg: list[Any]) -> None:
        with contextlib.suppress(RuntimeError):      # the loop is closed: nobody is waiting any more
            self._loop.call_soon_threadsafe(callback, arg)

    def _apply(self, finished: list[Finished]) -> None:
        for pq, mq, chunks, results in finished:
            self._process_results(pq, mq, chunks, results)

    def _call_sync(self, mq: MessageQueue, chunk: Chunk) -> Outcome:
        context = ConsumeConcurrentlyContext(mq)
        try:
            status = self._listener(chunk, context)
        except Exception:
            log.exception("listener of %s failed on %d messages of %s", self._group, len(chunk), mq)
            return 0, context.delay_level_when_next_consume
        if status is SUCCESS and context.ack_index >= len(chunk) - 1:   # the common case, once per chunk
            return len(chunk), 0
        if inspect.isawaitable(status):
            log.error("listener of %s returned an awaitable; declare it `async def`", self._group)
            if inspect.iscoroutine(status):
                status.close()
        return acked_count(status, context, len(chunk)), context.delay_level_when_next_consume

    def _process_results(self, pq: ProcessQueue, mq: MessageQueue, chunks: list[Chunk],
                         results: list[Outcome]) -> None:
        if pq.dropped:                       # a dropped queue discards results (§12)
            return
        done: list[MessageExt] = []
        failed: list[tuple[Chunk, int]] = []
        for chunk, (acked, delay_level) in zip(chunks, results, strict=True):
            if acked == len(chunk):
                done.extend(chunk)
                self.consumed_ok += acked
                continue
            rest = chunk[acked:]
            done.extend(chunk[:acked])
            self.consumed_ok += acked
            self.consumed_failed += len(rest)
            if self._message_model is MessageModel.BROADCASTING:
                log.warning("broadcasting consumer of %s dropped %d failed messages", self._group, len(rest))
                done.extend(rest)
            else:
                failed.append((rest, delay_level))
        if done:
            self._remove(pq, mq, done)
        if failed:
            self._spawn(self._send_back_failed(pq, mq, failed))

    def _remove(self, pq: ProcessQueue, mq: MessageQueue, messages: list[MessageExt]) -> None:
        queue_offset = pq.remove_messages(messages, now_ms=time.monotonic_ns() // 1_000_000)
        if queue_offset >= 0 and not pq.dropped:
            self._update_offset(mq, queue_offset)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_back_failed(self, pq: ProcessQueue, mq: MessageQueue, failed: list[tuple[Chunk, int]]) -> None:
        """Send each failed message back; remove the ones the broker took, retry the rest locally."""
        send_back = self._send_back
        messages = [(m, level) for chunk, level in failed for m in chunk]
        if send_back is None or self._closed:
            taken = [False] * len(messages)
        else:
            taken = list(await asyncio.gather(*(send_back(m, mq, level) for m, level in messages)))
        if pq.dropped:
            return
        back = [m for (m, _), ok in zip(messages, taken, strict=True) if ok]
        if back:
            self._remove(pq, mq, back)
        again = [m for (m, _), ok in zip(messages, taken, strict=True) if not ok]
        if again:
            self._reconsume_later(pq, mq, again)

    async def clean_expired_messages(self, process_queues: Mapping[MessageQueue, ProcessQueue],
                                     now_ms: int | None = None) -> int:
        """Send back (delay level 3) and remove every head message whose listener call started more
        than `consume_timeout_ms` ago, at most 16 per queue; returns how many. CLUSTERING only."""
        if self._send_back is None or self._message_model is MessageModel.BROADCASTING:
            return 0
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        count = 0
        for mq, pq in list(process_queues.items()):
            for message in pq.head_messages(EXPIRED_HEAD_MESSAGES):
                started = message.properties.get(PROPERTY_CONSUME_START_TIME)
                if pq.dropped or not started or now - int(started) <= self.consume_timeout_ms:
                    break
                log.warning("%s: message %s of %s has been consumed for over %d ms; sending it back",
                            self._group, message.msg_id, mq, self.consume_timeout_ms)
                if not await self._send_back(message, mq, EXPIRED_DELAY_LEVEL):
                    break
                if pq.head_messages(1) == [message]:
                    self._remove(pq, mq, [message])
                    count += 1
        self.expired += count
        return count

    def _reconsume_later(self, pq: ProcessQueue, mq: MessageQueue, chunk: Chunk) -> None:
        for message in chunk:
            message.reconsume_times += 1
        loop = asyncio.get_running_loop()

        def again() -> None:
            self._timers.discard(handle)
            if not pq.dropped and not self._closed:
                self.submit(pq, mq, chunk)
        handle = loop.call_later(self._reconsume_later_delay_ms / 1000, again)
        self._timers.add(handle)

    def close(self) -> None:
        """Start no listener call from now on (the first step of `shutdown`, taken at once)."""
        self._closed = True
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()

    async def shutdown(self, await_termination_ms: int) -> None:
        """Stop taking work: no listener call starts from now on (batches not started yet stay in
        their process queues, uncommitted). Wait up to `await_termination_ms` for the calls running
        now, so that their results reach the offset store before the caller persists it (RocketMQ
        `awaitTerminationMillisWhenShutdown`, default 0); calls still running then are abandoned:
        their messages are delivered again to whoever gets the queue."""
        self.close()
        timeout_ms = max(await_termination_ms, 0)
        deadline = time.monotonic() + timeout_ms / 1000
        if not await self._workers.wait_idle(timeout_ms):
            log.warning("%s: %d listener jobs unfinished after %d ms (await_termination_ms); the messages of "
                        "the calls still running will be delivered again", self._group, self._workers.in_flight,
                        timeout_ms)
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=max(deadline - time.monotonic(), 0))
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1)
        self._workers.close()


def _stamp_start(chunk: Chunk) -> None:
    """CONSUME_START_TIME (epoch ms) on every message of a chunk, just before its listener call."""
    start = str(time.time_ns() // 1_000_000)
    for message in chunk:
        message.properties[PROPERTY_CONSUME_START_TIME] = start


