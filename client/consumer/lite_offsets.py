"""`LiteOffsets`: where a `PullConsumer`'s queues start and what it commits (RocketMQ
`DefaultLitePullConsumerImpl`'s offset handling, REFERENCE.md §14).

A queue's consumed position is the offset after the last message `poll()` handed out
(`LitePullService.consumed_offsets`); committing puts those positions into the offset store and
writes them out: UPDATE_CONSUMER_OFFSET per queue to its broker for clustering (one-way, or
two-way when the caller waits), the local file for broadcasting. A queue starts at its stored
offset (`Rebalancer.compute_pull_from_where`), or at the broker's min or max for a seek."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from client.consumer.lite_pull_service import LitePullService, StartFrom
from client.consumer.offset_store import OffsetStore, ReadOffsetType
from client.instance import ClientInstance
from protocol.errors import MQError, QueryNotFound
from protocol.model import MessageModel, MessageQueue


class LiteOffsets:
    def __init__(self, *, consumer_group: str, message_model: MessageModel, instance: ClientInstance,
                 store: OffsetStore, pulls: LitePullService, request_timeout_ms: int,
                 compute_pull_from_where: Callable[[MessageQueue], Awaitable[int]]) -> None:
        self._group, self._model, self._instance = consumer_group, message_model, instance
        self.store, self._pulls, self._timeout_ms = store, pulls, request_timeout_ms
        self._compute_pull_from_where = compute_pull_from_where

    def address_of(self, mq: MessageQueue) -> str:
        """The address of `mq`'s broker (its master), else the first endpoint."""
        return self._instance.routes.master_address(mq.broker_name) or self._instance.endpoints[0]

    async def start_offset(self, mq: MessageQueue, start: StartFrom) -> int:
        """Where a queue's pull begins: MIN/MAX ask the broker, STORED is `compute_pull_from_where`
        (-1 when it cannot tell yet; the pull task asks again later). Raises `MQError` from the
        broker's min/max answers."""
        instance = self._instance
        if not instance.routes.has(mq.topic):
            await instance.update_route(mq.topic)
        if start is StartFrom.MIN:
            return await instance.api.get_min_offset(self.address_of(mq), mq.topic, mq.queue_id, self._timeout_ms)
        if start is StartFrom.MAX:
            return await instance.api.get_max_offset(self.address_of(mq), mq.topic, mq.queue_id, self._timeout_ms)
        self.store.remove_offset(mq)
        queue_offset = await self._compute_pull_from_where(mq)
        if queue_offset >= 0:
            self.store.update_offset(mq, queue_offset, increase_only=False)
        return queue_offset

    def take_positions(self) -> dict[MessageQueue, int]:
        """Every assigned queue's consumed position, put into the offset store; returned by queue."""
        positions = self._pulls.consumed_offsets()
        for mq, queue_offset in positions.items():
            self.store.update_offset(mq, queue_offset, increase_only=False)
        return positions

    def stored_positions(self) -> dict[MessageQueue, int]:
        """The offset store's positions of the queues pulled now (what a shutdown writes out)."""
        return {mq: o for mq in self._pulls.queues() if (o := self.store.memory_offset(mq)) is not None}

    async def write(self, positions: dict[MessageQueue, int], *, acknowledged: bool) -> None:
        """Write queue offsets out: clustering sends UPDATE_CONSUMER_OFFSET per queue (two-way when
        `acknowledged`, raising the first failure after trying all); broadcasting writes the file."""
        if self._model is MessageModel.BROADCASTING:
            await self.store.persist_all(self._pulls.queues())
            return
        failures: list[MQError] = []
        for mq, queue_offset in sorted(positions.items()):
            try:
                await self._instance.api.update_consumer_offset(
                    self.address_of(mq), self._group, mq.topic, mq.queue_id, queue_offset,
                    oneway=not acknowledged, timeout_ms=self._timeout_ms)
            except MQError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    async def committed(self, queue: MessageQueue) -> int:
        """The stored offset of `queue` (the broker's for clustering, -1 when it has none; the local
        store's for broadcasting). Raises `MQError` when the broker cannot be asked."""
        if self._model is MessageModel.BROADCASTING:
            return await self.store.read_offset(queue, ReadOffsetType.MEMORY_FIRST_THEN_STORE)
        try:
            return await self._instance.api.query_consumer_offset(self.address_of(queue), self._group, queue.topic,
                                                                  queue.queue_id, self._timeout_ms)
        except QueryNotFound:
            return -1

    async def forget(self, mq: MessageQueue) -> None:
        """`mq` is no longer assigned: write its offset out, then drop it from memory."""
        await self.store.persist(mq)
        self.store.remove_offset(mq)
