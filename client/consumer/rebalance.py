"""`Rebalancer`: which queues this consumer pulls (RocketMQ `RebalanceImpl`/`RebalancePushImpl`,
REFERENCE.md §8 computePullFromWhere, §12 Rebalance).

Clustering: the topic's readable queues and the group's client ids, both sorted, go to the
allocation strategy; queues no longer assigned are dropped (offset persisted, then removed);
new ones start from `compute_pull_from_where`. Broadcasting: every queue. A failed lookup of the
client ids keeps the current assignment (§16.14).

A push consumer's queue whose pull loop made no attempt for `pull_max_idle_time_ms` (120 s; flow
control, a suspend and a missing lock count as attempts, as RocketMQ stamps before those checks) has
its pull restarted from the offset it was about to pull, its process queue kept. RocketMQ drops and
recreates the process queue there, which rewinds to the committed offset and throws away the
results of the listener calls in flight: every message since the last commit would come again.

Orderly CLUSTERING consumers (`locking` given, §11): a new queue is taken only once its broker lock
is granted; a dropped queue first waits (at most 1 s) for the listener call in progress, then has
its offset persisted, then is unlocked: at once, or after `unlock_delay_time_ms` (20 s) when it
still caches messages. If the call takes longer than 1 s the unlock waits for it in the
background. Unlike RocketMQ, a delayed unlock is skipped when the queue was assigned here again
meanwhile (it would release a lock in use)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Protocol

from client.api import ClientAPI
from client.consumer.allocate import AllocateMessageQueueStrategy
from client.consumer.offset_store import NOT_FOUND, OffsetStore, ReadOffsetType
from client.consumer.process_queue import PULL_MAX_IDLE_TIME_MS, ProcessQueue
from client.consumer.pull_service import now_ms
from client.consumer.queue_locker import QueueLocker
from client.route import RouteTable
from protocol.errors import MQError
from protocol.model import ConsumeFromWhere, MessageModel, MessageQueue
from protocol.topics import is_retry_topic

log = logging.getLogger(__name__)
DROP_WAIT_FOR_CONSUME_MS = 1_000


class QueuePuller(Protocol):
    """What the rebalance drives: the push consumer's `PullService` or the lite `LitePullService`."""

    def start(self, mq: MessageQueue, pq: ProcessQueue, queue_offset: int) -> None: ...

    async def stop(self, mq: MessageQueue) -> None: ...


class QueueLocking(Protocol):
    """What an orderly consumer adds to the rebalance: broker locks and its per-queue consume locks."""

    locker: QueueLocker
    unlock_delay_time_ms: int

    def queue_lock(self, mq: MessageQueue) -> asyncio.Lock: ...

    def forget_queue(self, mq: MessageQueue) -> None: ...


def parse_consume_timestamp(value: str) -> int:
    """`yyyyMMddHHmmss` in local time → epoch ms; raises `ValueError`."""
    return int(datetime.strptime(value, "%Y%m%d%H%M%S").timestamp() * 1000)


class Rebalancer:
    def __init__(self, *, consumer_group: str, client_id: Callable[[], str], message_model: MessageModel,
                 consume_from_where: ConsumeFromWhere, consume_timestamp_ms: int,
                 strategy: AllocateMessageQueueStrategy, api: ClientAPI, routes: RouteTable,
                 update_route: Callable[[str], object], offset_store: OffsetStore, pull_service: QueuePuller,
                 topics: Callable[[], list[str]], address_of: Callable[[MessageQueue], str],
                 request_timeout_ms: int,
                 restart_stalled: Callable[[MessageQueue, ProcessQueue], Awaitable[None]] | None = None,
                 pull_max_idle_time_ms: int = PULL_MAX_IDLE_TIME_MS,
                 locking: QueueLocking | None = None) -> None:
        self._group, self._client_id, self._model = consumer_group, client_id, message_model
        self._from_where, self._timestamp_ms = consume_from_where, consume_timestamp_ms
        self._strategy, self._api, self._routes = strategy, api, routes
        self._update_route = update_route
        self._offsets, self._pulls, self._topics = offset_store, pull_service, topics
        self._address_of = address_of
        self._timeout_ms = request_timeout_ms
        self._restart_stalled = restart_stalled     # push consumers only, as RocketMQ
        self._pull_max_idle_ms = pull_max_idle_time_ms
        self._locking = locking if message_model is MessageModel.CLUSTERING else None
        self._unlocks: dict[MessageQueue, asyncio.Task[None]] = {}     # unlocks waiting to be sent
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}

    async def do_rebalance(self) -> bool:
        """One rebalance of every subscribed topic; True when the assignment changed."""
        changed = False
        topics = self._topics()
        for topic in topics:
            allocated = await self._allocate(topic)
            if allocated is not None:
                changed |= await self._update_process_queues(topic, allocated)
        for mq in [mq for mq in self.process_queues if mq.topic not in topics]:
            await self.remove_queue(mq)
            changed = True
        return changed

    async def _allocate(self, topic: str) -> set[MessageQueue] | None:
        if not self._routes.has(topic):
            await self._update_route(topic)  # type: ignore[misc]
        mq_all = sorted(self._routes.subscribe_queues(topic))
        if not mq_all:
            log.debug("no route for topic %s yet; group %s waits", topic, self._group)
            return None
        if self._model is MessageModel.BROADCASTING:
            return set(mq_all)
        address = self._routes.any_broker_address(topic)
        if address is None:
            return None
        try:
            cid_all = sorted(await self._api.get_consumer_id_list(address, self._group, self._timeout_ms))
        except MQError as exc:
            log.info("cannot list consumers of %s: %s; keeping the current assignment", self._group, exc)
            return None
        try:
            return set(self._strategy.allocate(self._group, self._client_id(), mq_all, cid_all))
        except ValueError as exc:
            log.warning("allocation of %s by %s failed: %s", topic, self._strategy.name, exc)
            return None

    async def _update_process_queues(self, topic: str, allocated: set[MessageQueue]) -> bool:
        changed = False
        now = now_ms()
        for mq, pq in list(self.process_queues.items()):
            if mq.topic != topic:
                continue
            if mq not in allocated:
                await self.remove_queue(mq)
                changed = True
            elif self._restart_stalled is not None and pq.is_pull_expired(now, self._pull_max_idle_ms):
                log.warning("group %s: no pull attempt on %s for over %d ms; restarting its pull (its process "
                            "queue kept)", self._group, mq, self._pull_max_idle_ms)
                await self._restart_stalled(mq, pq)
        for mq in sorted(allocated - set(self.process_queues)):
            locked_at_ms = None
            if self._locking is not None:
                locked_at_ms = await self._locking.locker.lock(mq)
                if locked_at_ms is None:
                    log.info("group %s (%s): %s is still locked by another consumer", self._group,
                             self._client_id(), mq)
                    continue
                self._cancel_unlock(mq)
            self._offsets.remove_offset(mq)            # removeDirtyOffset
            queue_offset = await self.compute_pull_from_where(mq)
            if queue_offset < 0:
                continue
            pq = ProcessQueue(now_ms=now)
            if locked_at_ms is not None:
                pq.locked, pq.last_lock_at_ms = True, locked_at_ms
            self.process_queues[mq] = pq
            self._offsets.update_offset(mq, queue_offset, increase_only=False)
            self._pulls.start(mq, pq, queue_offset)
            log.info("group %s (%s) now pulls %s from offset %d", self._group, self._client_id(), mq, queue_offset)
            changed = True
        return changed

    async def remove_queue(self, mq: MessageQueue) -> None:
        """Drop a queue: mark its process queue dropped, stop its pull, persist and forget its offset
        (orderly: after the call in progress, then unlock it; see the module docstring)."""
        pq = self.process_queues.pop(mq, None)
        if pq is None:
            return
        locking = self._locking
        if locking is None:
            pq.dropped = True
            await self._pulls.stop(mq)
            await self._offsets.persist(mq)
            self._offsets.remove_offset(mq)
            log.info("group %s (%s) dropped %s", self._group, self._client_id(), mq)
            return
        await self._pulls.stop(mq)
        consume_lock = locking.queue_lock(mq)
        try:
            async with asyncio.timeout(DROP_WAIT_FOR_CONSUME_MS / 1000):
                await consume_lock.acquire()
            busy = False
        except TimeoutError:
            busy = True
        pq.dropped = True
        try:
            await self._offsets.persist(mq)
            self._offsets.remove_offset(mq)
        finally:
            if not busy:
                consume_lock.release()
        locking.forget_queue(mq)
        log.info("group %s (%s) dropped %s%s", self._group, self._client_id(), mq,
                 " while its listener call goes on" if busy else "")
        self._cancel_unlock(mq)
        task = asyncio.get_running_loop().create_task(self._unlock(mq, pq, consume_lock if busy else None))
        self._unlocks[mq] = task
        task.add_done_callback(lambda t: self._unlocks.pop(mq, None) if self._unlocks.get(mq) is t else None)

    async def _unlock(self, mq: MessageQueue, pq: ProcessQueue, busy: asyncio.Lock | None) -> None:
        assert self._locking is not None
        if busy is not None:                 # the listener call still runs: unlock after it
            async with busy:
                pass
        if pq.has_temp_message():
            await asyncio.sleep(self._locking.unlock_delay_time_ms / 1000)
        if mq not in self.process_queues:
            await self._locking.locker.unlock([mq])

    def _cancel_unlock(self, mq: MessageQueue) -> None:
        task = self._unlocks.pop(mq, None)
        if task is not None:
            task.cancel()

    async def unlock_all(self) -> None:
        """At shutdown (orderly CLUSTERING): release every queue held, delayed unlocks included,
        waiting for the broker's answers (RocketMQ `unlockAll(false)`)."""
        if self._locking is None:
            return
        queues = set(self.process_queues) | set(self._unlocks)
        for task in list(self._unlocks.values()):
            task.cancel()
        self._unlocks.clear()
        if queues:
            await self._locking.locker.unlock(sorted(queues), oneway=False)

    async def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """Where a newly assigned queue starts (RocketMQ `computePullFromWhere`): the stored offset
        if any; otherwise by `consume_from_where`: LAST → the queue's max offset (0 for a retry topic),
        FIRST → 0, TIMESTAMP → the offset at `consume_timestamp` (max for a retry topic). -1 when the
        store or broker could not be asked (the queue is skipped this round)."""
        last = await self._offsets.read_offset(mq, ReadOffsetType.READ_FROM_STORE)
        if last >= 0:
            return last
        if last != NOT_FOUND:
            return -1
        address = self._address_of(mq)
        try:
            if self._from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
                return 0
            if self._from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
                if is_retry_topic(mq.topic):
                    return await self._api.get_max_offset(address, mq.topic, mq.queue_id, self._timeout_ms)
                return await self._api.search_offset(address, mq.topic, mq.queue_id, self._timestamp_ms,
                                                     self._timeout_ms)
            if is_retry_topic(mq.topic):
                return 0
            return await self._api.get_max_offset(address, mq.topic, mq.queue_id, self._timeout_ms)
        except MQError as exc:
            log.info("cannot compute the start offset of %s: %s", mq, exc)
            return -1
