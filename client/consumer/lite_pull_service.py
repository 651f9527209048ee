"""`LitePullService`: the background pulls of a `PullConsumer` (RocketMQ's lite pull, §14).

One long-polling task per assigned queue (its own subscription in each pull, as the lite pull
consumer sends it), all filling one buffer that `take` empties; a queue holding
`pull_threshold_for_queue` messages waits until `take` makes room, so memory stays bounded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

from client.api import ClientAPI, PullResult
from client.consumer.process_queue import ProcessQueue
from client.consumer.pull_nodes import PullFromWhichNode
from client.consumer.pull_service import TopicSubscription, now_ms, refilter
from protocol.codes import PullSysFlag
from protocol.errors import MQError, NoPermission, ResponseError
from protocol.headers import PullMessageRequestHeader
from protocol.message import PROPERTY_MAX_OFFSET, PROPERTY_MIN_OFFSET, MessageExt
from protocol.model import MessageQueue, PullStatus

log = logging.getLogger(__name__)

LITE_PULL_SYS_FLAG = PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND | PullSysFlag.LITE_PULL
BROKER_SUSPEND_MAX_MS = 20_000              # brokerSuspendMaxTimeMillis: how long the broker may hold a pull
CONSUMER_TIMEOUT_WHEN_SUSPEND_MS = 30_000   # RPC timeout of a held pull, above the suspend time
PULL_DELAY_WHEN_ERROR_MS = 1_000            # after a broker error response
PULL_DELAY_WHEN_EXCEPTION_MS = 3_000        # after no response (connection, timeout) or a client failure
FLOW_CONTROL_RESTAMP_MS = 10_000            # a queue waiting for room re-stamps `last_pull_at_ms` this often
MAX_POLL_BATCHES = 10                       # one poll returns at most 10 * pull_batch_size messages
MIN_AUTO_COMMIT_INTERVAL_MS = 1_000


class StartFrom(Enum):
    """Where a queue's pull begins when it is not an explicit queue offset."""

    STORED = "STORED"   # the committed offset, else by `consume_from_where` (`compute_pull_from_where`)
    MIN = "MIN"         # GET_MIN_OFFSET (seek_to_begin)
    MAX = "MAX"         # GET_MAX_OFFSET (seek_to_end)


@dataclass(slots=True, eq=False)
class _QueueState:
    pq: ProcessQueue
    consumed_offset: int | None          # offset after the last message handed out; None until known
    room: asyncio.Event = field(default_factory=asyncio.Event)
    generation: int = 0                  # bumped by each seek; a task of an older generation stops
    task: asyncio.Task[None] | None = None


@dataclass(slots=True, eq=False)
class _Batch:
    state: _QueueState
    messages: list[MessageExt]


class LitePullService:
    """One long-polling task per assigned queue, all filling one buffer that `take` empties in
    arrival order (each queue's messages in queue order). Driven like `PullService` by the
    `Rebalancer` (`start` / `stop`), and by `assign` and seeks. A queue caching
    `pull_threshold_for_queue` messages stops pulling until `take` makes room."""

    def __init__(self, *, api: ClientAPI, address_of: Callable[[MessageQueue], str], consumer_group: str,
                 pull_batch_size: int, pull_threshold_for_queue: int,
                 subscription_of: Callable[[str], TopicSubscription],
                 start_offset_of: Callable[[MessageQueue, StartFrom], Awaitable[int]],
                 on_remove: Callable[[MessageQueue, int], None], nodes: PullFromWhichNode | None = None) -> None:
        self._api, self._group = api, consumer_group
        self._nodes = nodes if nodes is not None else PullFromWhichNode(address_of, lambda name, broker_id: None)
        self._batch_size, self._threshold = pull_batch_size, pull_threshold_for_queue
        self._subscription_of, self._start_offset_of, self._on_remove = subscription_of, start_offset_of, on_remove
        self._queues: dict[MessageQueue, _QueueState] = {}
        self._buffer: deque[_Batch] = deque()
        self._arrived = asyncio.Event()
        self._retired: set[asyncio.Task[None]] = set()
        self._closed = False

    def queues(self) -> list[MessageQueue]:
        return sorted(self._queues)

    def has(self, mq: MessageQueue) -> bool:
        return mq in self._queues

    def consumed_offsets(self) -> dict[MessageQueue, int]:
        return {mq: s.consumed_offset for mq, s in self._queues.items() if s.consumed_offset is not None}

    def start(self, mq: MessageQueue, pq: ProcessQueue, start: int | StartFrom) -> None:
        if mq in self._queues:
            raise RuntimeError(f"{mq} is already being pulled")
        state = self._queues[mq] = _QueueState(pq, start if isinstance(start, int) else None)
        self._launch(mq, state, start)

    def seek(self, mq: MessageQueue, start: int | StartFrom) -> None:
        """Drop what is buffered for `mq` and restart its pull from `start`."""
        state = self._queues[mq]
        state.generation += 1
        self._retire(state.task)
        self._purge(state)
        state.consumed_offset = start if isinstance(start, int) else None
        self._launch(mq, state, start)

    def discard(self, mq: MessageQueue) -> asyncio.Task[None] | None:
        """Forget `mq` (its consumed position goes to `on_remove` first); returns its cancelled task."""
        state = self._queues.pop(mq, None)
        if state is None:
            return None
        state.pq.dropped = True
        self._purge(state)
        if state.consumed_offset is not None:
            self._on_remove(mq, state.consumed_offset)
        self._retire(state.task)
        return state.task

    async def stop(self, mq: MessageQueue) -> None:
        task = self.discard(mq)
        if task is not None:
            await asyncio.wait({task})

    def close(self) -> None:
        """No more pulls start; waiting `take`s return at once."""
        self._closed = True
        self._arrived.set()

    async def stop_all(self) -> None:
        """Cancel every pull task and await them; the queues and their positions stay known."""
        self.close()
        for state in self._queues.values():
            self._retire(state.task)
        if self._retired:
            await asyncio.wait(set(self._retired))

    def _launch(self, mq: MessageQueue, state: _QueueState, start: int | StartFrom) -> None:
        state.room.set()
        if self._closed:
            state.task = None
            return
        state.task = asyncio.get_running_loop().create_task(
            self._pull_loop(mq, state, state.generation, start), name=f"lite-pull {mq.topic}:{mq.queue_id}")

    def _retire(self, task: asyncio.Task[None] | None) -> None:
        if task is not None and not task.done():
            task.cancel()
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    def _purge(self, state: _QueueState) -> None:
        if any(batch.state is state for batch in self._buffer):
            self._buffer = deque(batch for batch in self._buffer if batch.state is not state)
        state.pq.clear()

    # -- handing out -----------------------------------------------------------------------------

    async def take(self, limit: int, timeout_ms: int) -> list[MessageExt]:
        """Up to `limit` buffered messages, waiting up to `timeout_ms` for the first; [] on timeout
        or once closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            messages = self._take_buffered(limit)
            remaining = deadline - loop.time()
            if messages or self._closed or remaining <= 0:
                return messages
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()

    def _take_buffered(self, limit: int) -> list[MessageExt]:
        taken: list[MessageExt] = []
        buffer = self._buffer
        while buffer and len(taken) < limit:
            batch = buffer[0]
            part = batch.messages[:limit - len(taken)]
            if len(part) == len(batch.messages):
                buffer.popleft()
            else:
                del batch.messages[:len(part)]
            state = batch.state
            state.pq.remove_messages(part)
            state.consumed_offset = part[-1].queue_offset + 1
            state.room.set()
            taken.extend(part)
        return taken

    # -- pulling ---------------------------------------------------------------------------------

    async def _pull_loop(self, mq: MessageQueue, state: _QueueState, generation: int,
                         start: int | StartFrom) -> None:
        queue_offset = start if isinstance(start, int) else await self._resolve(mq, state, start)
        while True:
            await self._wait_for_room(state)
            sub = self._subscription_of(mq.topic)
            state.pq.last_pull_at_ms = now_ms()
            header = PullMessageRequestHeader(
                consumer_group=self._group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=queue_offset,
                max_msg_nums=self._batch_size, sys_flag=LITE_PULL_SYS_FLAG, commit_offset=0,
                suspend_timeout_ms=BROKER_SUSPEND_MAX_MS, sub_version=sub.sub_version,
                subscription=sub.expression, expression_type=sub.expression_type)
            try:
                result = await self._nodes.pull(self._api, mq, header, CONSUMER_TIMEOUT_WHEN_SUSPEND_MS)
            except ResponseError as exc:     # NO_PERMISSION (credentials, ACL) said louder
                log.log(logging.WARNING if isinstance(exc, NoPermission) else logging.INFO,
                        "pull of %s (group %s) failed: %s; retrying in %d ms", mq, self._group, exc,
                        PULL_DELAY_WHEN_ERROR_MS)
                delay_ms = PULL_DELAY_WHEN_ERROR_MS
            except MQError as exc:
                log.info("pull of %s (group %s) failed: %s; retrying in %d ms", mq, self._group, exc,
                         PULL_DELAY_WHEN_EXCEPTION_MS)
                delay_ms = PULL_DELAY_WHEN_EXCEPTION_MS
            except Exception:
                log.exception("pull of %s (group %s) failed; retrying in %d ms", mq, self._group,
                              PULL_DELAY_WHEN_EXCEPTION_MS)
                delay_ms = PULL_DELAY_WHEN_EXCEPTION_MS
            else:
                if state.generation != generation or state.pq.dropped:
                    return
                queue_offset, delay_ms = self._adopt(mq, state, queue_offset, result, sub)
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)

    async def _resolve(self, mq: MessageQueue, state: _QueueState, start: StartFrom) -> int:
        while True:
            try:
                queue_offset = await self._start_offset_of(mq, start)
            except MQError as exc:
                log.info("cannot find the %s offset of %s: %s", start.value, mq, exc)
                queue_offset = -1
            except Exception:
                log.exception("cannot find the %s offset of %s", start.value, mq)
                queue_offset = -1
            if queue_offset >= 0:
                state.consumed_offset = queue_offset
                return queue_offset
            await asyncio.sleep(PULL_DELAY_WHEN_EXCEPTION_MS / 1000)

    async def _wait_for_room(self, state: _QueueState) -> None:
        while state.pq.msg_count >= self._threshold:
            state.room.clear()
            state.pq.last_pull_at_ms = now_ms()   # waiting for poll is no stalled pull (rebalance drops those)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLOW_CONTROL_RESTAMP_MS / 1000):
                    await state.room.wait()

    def _adopt(self, mq: MessageQueue, state: _QueueState, queue_offset: int, result: PullResult,
               sub: TopicSubscription) -> tuple[int, int]:
        """Buffer what a pull found; returns the next pull's queue offset (`next_begin_offset`, for
        every status) and the delay before it."""
        messages: list[MessageExt] = []
        if result.status is PullStatus.FOUND:
            messages = refilter(result.messages, sub.tags_set)
            min_offset, max_offset = str(result.min_offset), str(result.max_offset)
            for message in messages:
                message.properties[PROPERTY_MIN_OFFSET] = min_offset
                message.properties[PROPERTY_MAX_OFFSET] = max_offset
        next_offset = result.next_begin_offset
        if messages:
            state.pq.put_messages(messages)
            self._buffer.append(_Batch(state, messages))
            self._arrived.set()
        elif state.pq.msg_count == 0:
            # Everything pulled was handed out and nothing up to next_offset is for us (filtered,
            # or an illegal offset corrected): the consumed position moves there.
            state.consumed_offset = next_offset
        if result.status is PullStatus.OFFSET_ILLEGAL:
            log.warning("offset %d of %s (group %s) is illegal; pulling from %d", queue_offset, mq, self._group,
                        next_offset)
            if next_offset == queue_offset:
                return next_offset, PULL_DELAY_WHEN_ERROR_MS
        return next_offset, 0
