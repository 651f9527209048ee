"""`OrderlyConsumeService`: consumes each queue in queue-offset order, one listener call at a time,
only while this client holds the queue's broker lock (RocketMQ `ConsumeMessageOrderlyService`,
REFERENCE.md §11).

One consume task per queue at a time: a pull that finds no task running for the queue starts one;
the task takes `consume_message_batch_max_size` messages at a time (`ProcessQueue.take_messages`,
lowest offsets first), calls the listener, and goes on until the cache is empty. Each iteration
(take, listener call, result) runs under the queue's `asyncio.Lock`, which the rebalance takes
before it drops the queue, so no listener call of a dropped queue overlaps its unlock.

- CLUSTERING: no listener call without a lock that the broker granted and that is younger than
  `lock_max_live_time_ms`; otherwise the queue locks again after 100 ms (10 ms inside the loop) and
  resumes after 10 ms if granted, else after 3,000 ms.
- After `max_time_consume_continuously_ms` of continuous work the queue yields and resumes after
  10 ms, so one busy queue does not starve the others.
- Results with `auto_commit` (default): SUCCESS (COMMIT and ROLLBACK too) stores the offset after the
  batch; SUSPEND_CURRENT_QUEUE_A_MOMENT, `None` or an exception puts the batch back, adds 1 to each
  message's `reconsume_times` and calls again after `suspend_current_queue_time_ms` (clamped to
  10..30,000). A message that already failed `max_reconsume_times` times (-1: unlimited) is sent
  to `%RETRY%<group>` with `reconsume_times` unchanged, which the broker routes to `%DLQ%<group>`,
  and the queue moves on; if that send fails, it is suspended like the others.
- Without `auto_commit`: SUCCESS leaves the offset, COMMIT stores it, ROLLBACK and SUSPEND put
  the batch back and suspend.

A sync listener runs in one of `consume_thread_max` threads, up to `SYNC_RUN_BATCHES` batches
one after another per thread hop (for at most `SYNC_RUN_MAX_S`, and only while each call answers
SUCCESS with `auto_commit`): with a hop per batch, the hop, not the listener, set the rate (about
35,000 msg/s for a no-op listener and batches of one). The results are applied on the loop as
each call's would be; the batches a run did not reach go back to the cache. An async listener is
awaited on the loop, which is yielded to every `YIELD_EVERY_BATCHES` batches."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

from client.api import ClientAPI
from client.consumer.listener import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    OrderlyListenerResult,
    OrderlyMessageListener,
)
from client.consumer.offset_store import OffsetUpdate
from client.consumer.process_queue import ProcessQueue
from client.consumer.queue_locker import QueueLocker
from client.consumer.send_back import CLIENT_INNER_PRODUCER_GROUP, retry_copy_properties
from client.consumer.sync_workers import SyncWorkers
from protocol.errors import MQError
from protocol.headers import SendMessageRequestHeader
from protocol.message import MessageExt
from protocol.model import MessageModel, MessageQueue
from protocol.topics import retry_topic

log = logging.getLogger(__name__)
SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
UNLIMITED_RECONSUME_TIMES = 2**31 - 1          # orderly max_reconsume_times -1 (Integer.MAX_VALUE)
SUSPEND_MIN_MS, SUSPEND_MAX_MS = 10, 30_000
RELOCK_DELAY_OUTSIDE_MS, RELOCK_DELAY_INSIDE_MS = 100, 10
RESUME_AFTER_LOCK_MS, RESUME_AFTER_LOCK_FAILED_MS = 10, 3_000
RESUME_AFTER_YIELD_MS = 10
YIELD_EVERY_BATCHES = 32
SYNC_RUN_BATCHES = 32          # a sync listener's batches per thread hop, at most
SYNC_RUN_MAX_S = 0.005         # ... and no new batch in a hop after this long
# One sync listener call of a hop: its batch, context, result, when (ms) and how long (s) it ran.
_SyncCall = tuple[list[MessageExt], ConsumeOrderlyContext, OrderlyListenerResult, int, float]


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def orderly_max_reconsume_times(max_reconsume_times: int) -> int:
    """-1 (the option's default) -> unlimited, as RocketMQ's orderly consumer."""
    return UNLIMITED_RECONSUME_TIMES if max_reconsume_times == -1 else max_reconsume_times


def suspend_time_ms(context: ConsumeOrderlyContext, default_ms: int) -> int:
    """The context's suspend time (-1: `default_ms`), clamped to 10..30,000 ms."""
    value = default_ms if context.suspend_current_queue_time_ms == -1 else context.suspend_current_queue_time_ms
    return min(max(value, SUSPEND_MIN_MS), SUSPEND_MAX_MS)


def dlq_bound_header(message: MessageExt, group: str, max_reconsume_times: int) -> SendMessageRequestHeader:
    """The send of a message that failed `max_reconsume_times` times (RocketMQ orderly
    `sendMessageBack`): to `%RETRY%<group>` with its properties, RETRY_TOPIC = its topic,
    ORIGIN_MESSAGE_ID kept from the first attempt, MAX_RECONSUME_TIMES, DELAY 3 + reconsume_times,
    and `reconsume_times` unchanged in the header, so the broker sees it at the limit and stores it
    in `%DLQ%<group>`. Pure but for the born time."""
    return SendMessageRequestHeader(producer_group=CLIENT_INNER_PRODUCER_GROUP, topic=retry_topic(group), queue_id=0,
                                    flag=message.flag, born_timestamp=time.time_ns() // 1_000_000,
                                    properties=retry_copy_properties(message, max_reconsume_times),
                                    reconsume_times=message.reconsume_times,
                                    max_reconsume_times=max_reconsume_times)


class OrderlyConsumeService:
    def __init__(self, listener: OrderlyMessageListener, *, consume_thread_max: int, batch_max_size: int,
                 message_model: MessageModel, update_offset: OffsetUpdate, consumer_group: str,
                 max_reconsume_times: int, suspend_current_queue_time_ms: int, lock_max_live_time_ms: int,
                 max_time_consume_continuously_ms: int, locker: QueueLocker, api: ClientAPI,
                 address_of: Callable[[MessageQueue], str], request_timeout_ms: int,
                 unlock_delay_time_ms: int) -> None:
        self._listener = listener
        self._is_async = inspect.iscoroutinefunction(listener)
        self._batch_max_size = batch_max_size
        self._clustering = message_model is MessageModel.CLUSTERING
        self._update_offset = update_offset
        self._group = consumer_group
        self.observe: Callable[[str, int, float, float], None] | None = None   # metrics, per listener call
        self.max_reconsume_times = orderly_max_reconsume_times(max_reconsume_times)
        self._suspend_ms = suspend_current_queue_time_ms
        self._lock_max_live_ms = lock_max_live_time_ms
        self._max_continuously_ms = max_time_consume_continuously_ms
        self.locker, self._api, self._address_of = locker, api, address_of
        self._timeout_ms = request_timeout_ms
        self.unlock_delay_time_ms = unlock_delay_time_ms      # read by the rebalance (`QueueLocking`)
        self._workers = SyncWorkers(consume_thread_max, f"orderly-{consumer_group}")
        self._queue_locks: dict[MessageQueue, asyncio.Lock] = {}
        self._active: set[ProcessQueue] = set()       # a consume task runs or is scheduled
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.consumed_ok = 0
        self.consumed_failed = 0
        self.sent_to_dlq = 0

    def queue_lock(self, mq: MessageQueue) -> asyncio.Lock:
        """The lock held by each iteration of `mq`'s consumption (RocketMQ's per-queue lock objects);
        the rebalance takes it before dropping the queue."""
        lock = self._queue_locks.get(mq)
        if lock is None:
            lock = self._queue_locks[mq] = asyncio.Lock()
        return lock

    def forget_queue(self, mq: MessageQueue) -> None:
        """`mq` is no longer assigned: its lock object may go once nobody holds or waits for it."""
        lock = self._queue_locks.get(mq)
        if lock is not None and not lock.locked():
            del self._queue_locks[mq]

    def submit(self, pq: ProcessQueue, mq: MessageQueue, messages: list[MessageExt]) -> None:
        """New messages are in `pq`: start its consume task unless one runs or is scheduled."""
        if pq not in self._active:
            self._active.add(pq)
            self._spawn(self._consume(pq, mq))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _resume_later(self, pq: ProcessQueue, mq: MessageQueue, delay_ms: int) -> None:
        """Run `pq`'s consumption again after `delay_ms` (it stays active meanwhile)."""
        async def later() -> None:
            await asyncio.sleep(delay_ms / 1000)
            await self._consume(pq, mq)
        self._spawn(later())

    def _relock_later(self, pq: ProcessQueue, mq: MessageQueue, delay_ms: int) -> None:
        """RocketMQ `tryLockLaterAndReconsume`: lock after `delay_ms`, resume 10 ms after a grant or
        3 s after a refusal."""
        async def later() -> None:
            await asyncio.sleep(delay_ms / 1000)
            locked = await self.locker.lock_pq(mq, pq)
            self._resume_later(pq, mq, RESUME_AFTER_LOCK_MS if locked else RESUME_AFTER_LOCK_FAILED_MS)
        self._spawn(later())

    def _lock_ok(self, pq: ProcessQueue) -> bool:
        return not self._clustering or (pq.locked and not pq.is_lock_expired(now_ms(), self._lock_max_live_ms))

    async def _consume(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        if pq.dropped:
            self._active.discard(pq)
            return
        if not self._lock_ok(pq):
            self._relock_later(pq, mq, RELOCK_DELAY_OUTSIDE_MS)
            return
        lock, batches = self.queue_lock(mq), 0
        deadline_ms = now_ms() + self._max_continuously_ms
        clustering, lock_max_live_ms = self._clustering, self._lock_max_live_ms
        listener, is_async, batch_max_size = self._listener, self._is_async, self._batch_max_size
        update_offset = self._update_offset
        while True:                          # the per-message path: kept flat on purpose
            if pq.dropped or self._closed:
                self._active.discard(pq)
                return
            now = time.monotonic_ns() // 1_000_000
            if clustering and (not pq.locked or now - pq.last_lock_at_ms > lock_max_live_ms):
                self._relock_later(pq, mq, RELOCK_DELAY_INSIDE_MS)
                return
            if now > deadline_ms:
                self._resume_later(pq, mq, RESUME_AFTER_YIELD_MS)
                return
            async with lock:
                if pq.dropped or self._closed:
                    continue
                if not is_async:
                    ran = await self._run_sync_batches(pq, mq, now, deadline_ms)
                    if ran < 0:
                        return
                    batches += ran
                    continue
                messages = pq.take_messages(batch_max_size, now_ms=now)
                if not messages:
                    self._active.discard(pq)
                    return
                context = ConsumeOrderlyContext(mq)
                status: OrderlyListenerResult
                started = time.perf_counter()
                try:
                    status = await cast(Awaitable[OrderlyListenerResult], listener(messages, context))
                except Exception:
                    log.exception("orderly listener of %s failed on %d messages of %s", self._group,
                                  len(messages), mq)
                    status = None
                if self.observe is not None:         # waited: since the pull that cached the messages
                    self.observe(mq.topic, len(messages), max(now - pq.last_pull_at_ms, 0) / 1000,
                                 time.perf_counter() - started)
                if status is SUCCESS and context.auto_commit:
                    self.consumed_ok += len(messages)
                    commit_offset = pq.commit()
                    if commit_offset >= 0 and not pq.dropped:
                        update_offset(mq, commit_offset)
                elif not await self._process_result(pq, mq, messages, status, context):
                    return
            batches += 1
            if batches % YIELD_EVERY_BATCHES == 0:
                await asyncio.sleep(0)

    async def _run_sync_batches(self, pq: ProcessQueue, mq: MessageQueue, now: int, deadline_ms: int) -> int:
        """One thread hop of a sync listener (called under the queue's lock): take up to
        `SYNC_RUN_BATCHES` batches, call the listener on them one after another in a worker thread
        (`_sync_run`), then apply the results here as the async path applies each one. The
        batches after the call that ended the run go back to the cache untouched. Returns the
        listener calls made, or -1 when the consume task ends (the cache is empty, or the queue
        suspended)."""
        messages = pq.take_messages(self._batch_max_size * SYNC_RUN_BATCHES, now_ms=now)
        if not messages:
            self._active.discard(pq)
            return -1
        done: asyncio.Future[list[_SyncCall]] = asyncio.get_running_loop().create_future()

        def job() -> Callable[[], None]:
            calls = self._sync_run(pq, mq, messages, deadline_ms)
            return lambda: None if done.done() else done.set_result(calls)
        self._workers.submit(job)
        calls = await done
        if not calls:                        # closed or dropped while the job waited for a thread
            pq.make_messages_to_consume_again(messages)
            self._active.discard(pq)
            return -1
        last_batch, last_context, last_status = calls[-1][:3]
        called = sum(len(call[0]) for call in calls)
        if called < len(messages):
            pq.make_messages_to_consume_again(messages[called:])
        if self.observe is not None:             # waited: since the pull that cached the messages
            for batch, _, _, called_at_ms, took_s in calls:
                self.observe(mq.topic, len(batch), max(called_at_ms - pq.last_pull_at_ms, 0) / 1000, took_s)
        committed = last_status is SUCCESS and last_context.auto_commit
        succeeded = calls if committed else calls[:-1]
        if succeeded:
            self.consumed_ok += sum(len(call[0]) for call in succeeded)
            commit_offset = pq.commit(keep=() if committed else last_batch)
            if commit_offset >= 0 and not pq.dropped:
                self._update_offset(mq, commit_offset)
        if not committed and not await self._process_result(pq, mq, last_batch, last_status, last_context):
            return -1
        return len(calls)

    def _sync_run(self, pq: ProcessQueue, mq: MessageQueue, messages: list[MessageExt],
                  deadline_ms: int) -> list[_SyncCall]:
        """In a worker thread: call the sync listener on `messages` in batches of
        `consume_message_batch_max_size`, in offset order, while each call answers SUCCESS with
        `auto_commit` and the checks the loop makes before each batch still hold (the queue not
        dropped, its lock live, `max_time_consume_continuously_ms` not spent), for at most
        `SYNC_RUN_MAX_S`. The first batch is called unless the service closed or the queue was
        dropped while the job waited for a thread (the loop has just checked the rest). Reads of
        the process queue's flags only: the loop owns it."""
        calls: list[_SyncCall] = []
        size, clustering, lock_max_live_ms = self._batch_max_size, self._clustering, self._lock_max_live_ms
        run_started = time.perf_counter()
        for first in range(0, len(messages), size):
            called_at_ms = now_ms()
            if pq.dropped or self._closed:
                break
            if first and (called_at_ms > deadline_ms
                          or time.perf_counter() - run_started > SYNC_RUN_MAX_S
                          or (clustering and (not pq.locked or called_at_ms - pq.last_lock_at_ms > lock_max_live_ms))):
                break
            batch = messages[first:first + size]
            context = ConsumeOrderlyContext(mq)
            started = time.perf_counter()
            status = self._call_sync(batch, context)
            calls.append((batch, context, status, called_at_ms, time.perf_counter() - started))
            if status is not SUCCESS or not context.auto_commit:
                break
        return calls

    def _call_sync(self, messages: list[MessageExt], context: ConsumeOrderlyContext) -> OrderlyListenerResult:
        try:
            status = self._listener(messages, context)
        except Exception:
            log.exception("orderly listener of %s failed on %d messages of %s", self._group, len(messages),
                          context.message_queue)
            return None
        if status is SUCCESS:               # the usual answer, without `isawaitable`'s ABC check
            return status
        if inspect.isawaitable(status):
            log.error("orderly listener of %s returned an awaitable; declare it `async def`", self._group)
            if inspect.iscoroutine(status):
                status.close()
            return None
        return status

    async def _process_result(self, pq: ProcessQueue, mq: MessageQueue, messages: list[MessageExt],
                              status: OrderlyListenerResult, context: ConsumeOrderlyContext) -> bool:
        """Apply one listener result (RocketMQ `processConsumeResult`); False when the queue
        suspends (its messages were put back and it resumes later)."""
        if status is None:
            status = SUSPEND
        commit_offset = -1
        suspend = False
        if context.auto_commit:
            if status is SUSPEND:
                suspend = await self._check_reconsume_times(mq, messages)
                if not suspend:
                    commit_offset = pq.commit()
            else:
                if status is not SUCCESS:
                    log.warning("orderly listener of %s answered %s with auto_commit; taken as SUCCESS",
                                self._group, status.value)
                commit_offset = pq.commit()
        elif status is ConsumeOrderlyStatus.COMMIT:
            commit_offset = pq.commit()
        elif status is ConsumeOrderlyStatus.ROLLBACK:
            suspend = True
        elif status is SUSPEND:
            suspend = await self._check_reconsume_times(mq, messages)
        if suspend:
            self.consumed_failed += len(messages)
            pq.make_messages_to_consume_again(messages)
            self._resume_later(pq, mq, suspend_time_ms(context, self._suspend_ms))
            return False
        self.consumed_ok += len(messages)
        if commit_offset >= 0 and not pq.dropped:
            self._update_offset(mq, commit_offset)
        return True

    async def _check_reconsume_times(self, mq: MessageQueue, messages: list[MessageExt]) -> bool:
        """Count one more failure on each message; one past `max_reconsume_times` goes to the DLQ
        instead. True when any message stays to be consumed again (the batch suspends)."""
        suspend = False
        for message in messages:
            if message.reconsume_times >= self.max_reconsume_times and await self._send_to_dlq(mq, message):
                continue
            message.reconsume_times += 1
            suspend = True
        return suspend

    async def _send_to_dlq(self, mq: MessageQueue, message: MessageExt) -> bool:
        header = dlq_bound_header(message, self._group, self.max_reconsume_times)
        try:
            await self._api.send_message(self._address_of(mq), header, message.body, self._timeout_ms)
        except MQError as exc:
            log.warning("group %s: sending %s of %s towards the DLQ failed: %s; suspending", self._group,
                        message.msg_id, mq, exc)
            return False
        self.sent_to_dlq += 1
        log.info("group %s: %s of %s failed %d times; sent to the DLQ", self._group, message.msg_id, mq,
                 message.reconsume_times + 1)
        return True

    def close(self) -> None:
        """Start no listener call from now on (the first step of `shutdown`, taken at once)."""
        self._closed = True

    async def shutdown(self, await_termination_ms: int) -> None:
        """Stop starting work: no listener call starts from now on (the messages not taken stay
        cached, uncommitted). Wait up to `await_termination_ms` for the calls running now, whose
        results are applied, then cancel the rest (their messages are consumed again by the
        queue's next owner). RocketMQ `awaitTerminationMillisWhenShutdown`."""
        self.close()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=max(await_termination_ms, 0) / 1000)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1)
        self._workers.close()
