"""`ConcurrentConsumeService`: calls the listener for pulled messages with bounded concurrency
(RocketMQ `ConsumeMessageConcurrentlyService`, REFERENCE.md §9, §12).

A pulled batch is one consume job: its messages go to the listener in chunks of
`consume_message_batch_max_size`, one after another, and at most `consume_thread_max` jobs run at
once. A sync listener runs in a thread pool (the event loop never blocks); an async one is awaited.
One thread hop per pulled batch instead of per chunk keeps the hop cost off each message.

Results: CONSUME_SUCCESS removes the chunk from its process queue and advances the offset to the
queue's lowest unconsumed offset (at-least-once). RECONSUME_LATER, `None` or an exception keeps the
chunk in the process queue (holding the committed offset) and consumes it again locally after
`reconsume_later_delay_ms` with `reconsume_times` + 1: what RocketMQ does when a send-back fails.
Sending failed messages back to the broker comes with the retry work."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import cast

from client.consumer.listener import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ListenerResult,
    MessageListener,
)
from client.consumer.process_queue import ProcessQueue
from client.consumer.sync_workers import SyncWorkers
from protocol.message import PROPERTY_CONSUME_START_TIME, MessageExt
from protocol.model import MessageModel, MessageQueue

log = logging.getLogger(__name__)
OffsetUpdate = Callable[[MessageQueue, int], None]
SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
FAST_LISTENER_S = 50e-6
Chunk = list[MessageExt]


class ConcurrentConsumeService:
    def __init__(self, listener: MessageListener, *, consume_thread_max: int, batch_max_size: int,
                 reconsume_later_delay_ms: int, message_model: MessageModel, update_offset: OffsetUpdate,
                 consumer_group: str) -> None:
        self._listener = listener
        self._is_async = inspect.iscoroutinefunction(listener)
        self._batch_max_size = batch_max_size
        self._reconsume_later_delay_ms = reconsume_later_delay_ms
        self._message_model = message_model
        self._update_offset = update_offset
        self._group = consumer_group
        self._slots = asyncio.Semaphore(consume_thread_max)
        self._workers = SyncWorkers(consume_thread_max, f"consume-{consumer_group}")
        self._gathered: list[tuple[ProcessQueue, MessageQueue, list[Chunk]]] = []
        self.listener_seconds_per_message = 0.0     # EWMA, written by worker threads
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._closed = False
        self.consumed_ok = 0
        self.consumed_failed = 0

    def submit(self, pq: ProcessQueue, mq: MessageQueue, messages: list[MessageExt]) -> None:
        """Start consuming `messages` (already in `pq`); returns at once."""
        if self._closed or not messages:
            return
        size = self._batch_max_size
        chunks = [[m] for m in messages] if size == 1 else [messages[i:i + size]
                                                             for i in range(0, len(messages), size)]
        if not self._is_async:
            self._gathered.append((pq, mq, chunks))
            if len(self._gathered) == 1:
                asyncio.get_running_loop().call_soon(self._hand_to_workers)
            return
        task = asyncio.get_running_loop().create_task(self._run_job(pq, mq, chunks))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_job(self, pq: ProcessQueue, mq: MessageQueue, chunks: list[Chunk]) -> None:
        async with self._slots:
            if pq.dropped:
                return
            _stamp_start(chunks)
            results = [await self._call_async(mq, chunk) for chunk in chunks]
        self._process_results(pq, mq, chunks, results)

    def _hand_to_workers(self) -> None:
        """Give the batches gathered during one loop step to the worker threads. A thread hop costs
        ~100 µs of CPU here, so while the listener is fast (EWMA under `FAST_LISTENER_S` per
        message) they go as one job; a slow listener gets one job per batch, spread over threads."""
        jobs, self._gathered = self._gathered, []
        step = len(jobs) if self.listener_seconds_per_message < FAST_LISTENER_S else 1
        for i in range(0, len(jobs), step):
            group = jobs[i:i + step]
            self._workers.submit(lambda group=group: self._sync_jobs(group))  # type: ignore[misc]

    def _sync_jobs(self, jobs: list[tuple[ProcessQueue, MessageQueue, list[Chunk]]]) -> Callable[[], None]:
        """Runs in a worker thread; returns the completion that applies the results on the loop."""
        done: list[tuple[ProcessQueue, MessageQueue, list[Chunk], list[bool]]] = []
        started, count = time.perf_counter(), 0
        for pq, mq, chunks in jobs:
            if pq.dropped:
                continue
            _stamp_start(chunks)
            done.append((pq, mq, chunks, [self._call_sync(mq, chunk) for chunk in chunks]))
            count += sum(len(c) for c in chunks)
        if count:
            per_message = (time.perf_counter() - started) / count
            self.listener_seconds_per_message += (per_message - self.listener_seconds_per_message) * 0.2

        def complete() -> None:
            for pq, mq, chunks, results in done:
                self._process_results(pq, mq, chunks, results)
        return complete

    def _call_sync(self, mq: MessageQueue, chunk: Chunk) -> bool:
        try:
            status = self._listener(chunk, ConsumeConcurrentlyContext(mq))
        except Exception:
            log.exception("listener of %s failed on %d messages of %s", self._group, len(chunk), mq)
            return False
        if status is SUCCESS:                # the common case first: this runs once per chunk
            return True
        if inspect.isawaitable(status):
            log.error("listener of %s returned an awaitable; declare it `async def`", self._group)
            if inspect.iscoroutine(status):
                status.close()
        return False

    async def _call_async(self, mq: MessageQueue, chunk: Chunk) -> bool:
        try:
            status = await cast(Awaitable[ListenerResult], self._listener(chunk, ConsumeConcurrentlyContext(mq)))
        except Exception:
            log.exception("listener of %s failed on %d messages of %s", self._group, len(chunk), mq)
            return False
        return status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def _process_results(self, pq: ProcessQueue, mq: MessageQueue, chunks: list[Chunk], results: list[bool]) -> None:
        if pq.dropped:                       # a dropped queue discards results (§12)
            return
        done: list[MessageExt] = []
        for chunk, ok in zip(chunks, results, strict=True):
            if ok:
                done.extend(chunk)
                self.consumed_ok += len(chunk)
            else:
                self.consumed_failed += len(chunk)
                if self._message_model is MessageModel.BROADCASTING:
                    log.warning("broadcasting consumer of %s dropped %d failed messages", self._group, len(chunk))
                    done.extend(chunk)
                else:
                    self._reconsume_later(pq, mq, chunk)
        if done:
            queue_offset = pq.remove_messages(done)
            if queue_offset >= 0 and not pq.dropped:
                self._update_offset(mq, queue_offset)

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

    async def shutdown(self, await_termination_ms: int) -> None:
        """Stop taking work; wait for running jobs up to `await_termination_ms`, then abandon them
        (their messages stay unacknowledged and are consumed again by whoever gets the queue)."""
        self._closed = True
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        timeout_ms = max(await_termination_ms, 0)
        if not await self._workers.wait_idle(timeout_ms):
            log.warning("%s: abandoning %d listener jobs still running", self._group, self._workers.in_flight)
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_ms / 1000)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1)
        self._workers.close()


def _stamp_start(chunks: list[Chunk]) -> None:
    """CONSUME_START_TIME on every message of a job, once per job."""
    start = str(time.time_ns() // 1_000_000)
    for chunk in chunks:
        for message in chunk:
            message.properties[PROPERTY_CONSUME_START_TIME] = start


