"""`PullConsumer` (RocketMQ `DefaultLitePullConsumer`, REFERENCE.md §14): the application polls.

Either `subscribe()` topics, and the group shares their queues by rebalance as the push consumer
does, or `assign()` queues yourself (no rebalance); the two do not mix. One task per assigned queue
long-polls its broker and buffers what it gets (at most about `pull_threshold_for_queue` messages
per queue); `poll()` hands buffered messages out and moves each queue's consumed position past the
last one handed out. `commit()` / `commit_sync()`, and with `auto_commit` a commit every
`auto_commit_interval_ms` and at shutdown, store those positions: on the broker for clustering, in
a local file for broadcasting. Delivery is at-least-once.

    consumer = PullConsumer("group", "127.0.0.1:10911")
    consumer.subscribe("orders", "TagA || TagB")
    async with consumer:
        async for message in consumer:
            ...
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from client.consumer.allocate import AllocateMessageQueueStrategy
from client.consumer.group_member import GroupMember
from client.consumer.lite_offsets import LiteOffsets
from client.consumer.lite_pull_service import (
    MAX_POLL_BATCHES,
    MIN_AUTO_COMMIT_INTERVAL_MS,
    LitePullService,
    StartFrom,
)
from client.consumer.message_selector import MessageSelector
from client.consumer.offset_store import (
    DEFAULT_OFFSET_DIR,
    LocalFileOffsetStore,
    OffsetStore,
    RemoteBrokerOffsetStore,
)
from client.consumer.process_queue import ProcessQueue
from client.consumer.pull_nodes import PullFromWhichNode
from client.consumer.pull_service import TopicSubscription, now_ms
from client.consumer.rebalance import Rebalancer, parse_consume_timestamp
from client.errors import ClientStateError
from client.instance import ClientInstance, build_client_id, get_instance
from conf.client import ClientConfig, with_tls
from protocol.errors import MQError, NoPermission, TopicNotExist
from protocol.lifecycle import Lifecycle
from protocol.message import MessageExt
from protocol.model import ConsumeFromWhere, ConsumeType, ExpressionType, MessageModel, MessageQueue
from protocol.service import PeriodicService
from protocol.signing import Credentials
from protocol.topics import check_group

log = logging.getLogger(__name__)

class _Mode(Enum):
    SUBSCRIBE = "subscribe"
    ASSIGN = "assign"


@dataclass(slots=True, eq=False)
class _Running:
    instance: ClientInstance
    offsets: LiteOffsets
    pulls: LitePullService
    rebalancer: Rebalancer
    auto_commit: PeriodicService | None = None
    registered: bool = False
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class PullConsumer(GroupMember, Lifecycle):
    """Settings are RocketMQ's lite-pull-consumer ones in snake_case with its defaults.
    `offset_store_dir` is where broadcasting offsets live (default ~/.rocketq/offsets);
    `consume_timestamp` (yyyyMMddHHmmss, local time) is CONSUME_FROM_TIMESTAMP's start, by default
    30 minutes before `start()`. Raises `ValueError` for a bad group name or an out-of-range value.
    `credentials=Credentials(access_key, secret_key)` signs every request; a subscribing consumer
    whose route query is refused (wrong secret, no ACL) raises `NoPermission` from `start()`.
    `tls=True` connects over TLS, verifying servers with the system's CAs; `ssl_context=`
    (`conf.tls.client_context(ca_file=..., cert_file=..., key_file=...)`) with a CA of your own or a
    client certificate (mutual TLS)."""

    consume_type = ConsumeType.PULL

    def __init__(self, consumer_group: str, endpoints: str | Sequence[str], *,
                 message_model: str | MessageModel = "CLUSTERING",
                 consume_from_where: str | ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
                 allocate_strategy: AllocateMessageQueueStrategy | None = None, auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5_000, pull_batch_size: int = 10,
                 pull_threshold_for_queue: int = 1_000, poll_timeout_ms: int = 5_000, consume_timestamp: str = "",
                 offset_store_dir: Path | None = None, client_config: ClientConfig | None = None,
                 credentials: Credentials | None = None, tls: bool = False,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        remark = check_group(consumer_group)
        if remark is not None:
            raise ValueError(remark)
        if auto_commit_interval_ms < MIN_AUTO_COMMIT_INTERVAL_MS:
            raise ValueError(f"auto_commit_interval_ms = {auto_commit_interval_ms} is below "
                             f"{MIN_AUTO_COMMIT_INTERVAL_MS}")
        for name, value, low, high in (("pull_batch_size", pull_batch_size, 1, 1024),
                                       ("pull_threshold_for_queue", pull_threshold_for_queue, 1, 65535)):
            if not low <= value <= high:
                raise ValueError(f"{name} = {value} is out of range [{low}, {high}]")
        if poll_timeout_ms < 0:
            raise ValueError(f"poll_timeout_ms = {poll_timeout_ms} is negative")
        self._init_member(consumer_group, endpoints, message_model, consume_from_where, allocate_strategy)
        self.auto_commit, self.auto_commit_interval_ms = auto_commit, auto_commit_interval_ms
        self.pull_batch_size, self.pull_threshold_for_queue = pull_batch_size, pull_threshold_for_queue
        self.poll_timeout_ms, self.consume_timestamp = poll_timeout_ms, consume_timestamp
        self.offset_store_dir = offset_store_dir
        self.client_config = with_tls(client_config, tls, ssl_context)
        self.credentials = credentials
        self._assigned: list[MessageQueue] = []
        self._mode: _Mode | None = None       # fixed by the first subscribe() or assign()
        self._run: _Running | None = None
        self._shut_down = False

    # -- configuration ---------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        """Consume `topic`'s messages matching a TAG expression ("*", "A", "A || B") or a
        `MessageSelector` (`MessageSelector.by_sql("amount > 100")`), sharing its queues with the
        group; before or after `start()`. Raises `ClientStateError` after `assign()`, `ValueError` for
        a bad topic or tag expression; an SQL92 expression is checked by the broker when the group
        is joined (`start()` raises the broker's `SubscriptionParseFailed`)."""
        if self._mode is _Mode.ASSIGN:
            raise ClientStateError("subscribe() cannot be mixed with assign() on one consumer")
        subscription = TopicSubscription.of(topic, expression)
        self._mode = _Mode.SUBSCRIBE
        self._subscriptions[topic] = subscription
        if self._run is not None:
            self._spawn(self._join_group(self._run), f"subscribe {topic}")

    def unsubscribe(self, topic: str) -> None:
        if self._subscriptions.pop(topic, None) is not None and self._run is not None:
            self._spawn(self._join_group(self._run), f"unsubscribe {topic}")

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Consume exactly `queues` (all tags), with no rebalance; replaces an earlier assignment,
        before or after `start()`. Raises `ClientStateError` after `subscribe()`."""
        if self._mode is _Mode.SUBSCRIBE:
            raise ClientStateError("assign() cannot be mixed with subscribe() on one consumer")
        self._mode = _Mode.ASSIGN
        self._assigned = sorted(set(queues))
        if self._run is not None:
            self._apply_assignment(self._run)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and, with a subscription, join the group (heartbeat and a first rebalance); with an
        assignment, begin pulling. Returns once pulling has begun. A consumer is started once."""
        if self._shut_down:
            raise ClientStateError("consumer was shut down; create a new one")
        if self._run is not None:
            return
        clustering = self.message_model is MessageModel.CLUSTERING
        client_id = build_client_id(self.client_config.instance_name, unique_default=clustering)
        instance = get_instance(client_id, self.endpoints, self.client_config, self.credentials)
        store: OffsetStore
        if clustering:
            store = RemoteBrokerOffsetStore(instance.api, instance.routes, instance.endpoints[0],
                                            self.consumer_group, self.client_config.request_timeout_ms)
        else:
            store = LocalFileOffsetStore(self.offset_store_dir or DEFAULT_OFFSET_DIR, client_id, self.consumer_group)
        await store.load()

        def address_of(mq: MessageQueue) -> str:     # the master, a slave while it is down
            return instance.routes.subscribe_address(mq.broker_name) or instance.endpoints[0]

        run: _Running

        async def start_offset_of(mq: MessageQueue, start: StartFrom) -> int:
            return await run.offsets.start_offset(mq, start)

        def on_remove(mq: MessageQueue, consumed_offset: int) -> None:
            if self.auto_commit:
                store.update_offset(mq, consumed_offset, increase_only=False)

        pulls = LitePullService(api=instance.api, address_of=address_of, consumer_group=self.consumer_group,
                                pull_batch_size=self.pull_batch_size,
                                pull_threshold_for_queue=self.pull_threshold_for_queue,
                                subscription_of=self._subscription_of, start_offset_of=start_offset_of,
                                on_remove=on_remove,
                                nodes=PullFromWhichNode(address_of, instance.routes.broker_address))
        timestamp_ms = (parse_consume_timestamp(self.consume_timestamp) if self.consume_timestamp
                        else int(time.time() * 1000) - 30 * 60 * 1000)
        rebalancer = Rebalancer(
            consumer_group=self.consumer_group, client_id=lambda: instance.client_id,
            message_model=self.message_model, consume_from_where=self.consume_from_where,
            consume_timestamp_ms=timestamp_ms, strategy=self.allocate_strategy, api=instance.api,
            routes=instance.routes, update_route=instance.update_route, offset_store=store,
            pull_service=pulls, topics=self.subscribed_topics, address_of=address_of,
            request_timeout_ms=self.client_config.request_timeout_ms)
        offsets = LiteOffsets(consumer_group=self.consumer_group, message_model=self.message_model, instance=instance,
                              store=store, pulls=pulls, request_timeout_ms=self.client_config.request_timeout_ms,
                              compute_pull_from_where=rebalancer.compute_pull_from_where)
        run = _Running(instance, offsets, pulls, rebalancer)
        if self._mode is _Mode.SUBSCRIBE:
            instance.register_consumer(self)
            run.registered = True
        self._run = run
        await instance.start()
        if self._mode is _Mode.SUBSCRIBE:
            try:
                await self._join_group(run)
            except MQError:        # CHECK_CLIENT_CONFIG refused a subscription, or NO_PERMISSION
                await self.shutdown()
                raise
        elif self._mode is _Mode.ASSIGN:
            self._apply_assignment(run)
        if self.auto_commit:
            run.auto_commit = PeriodicService("auto-commit", self.auto_commit_interval_ms, self._auto_commit,
                                              (MQError,))
            await run.auto_commit.start()

    async def shutdown(self) -> None:
        """Stop pulling (waiting polls return []), commit the consumed positions when `auto_commit`,
        store the offsets (acknowledged by the broker for clustering), leave the group and release
        the client instance. Messages buffered and not polled are dropped."""
        run, self._run = self._run, None
        if run is None:
            return
        self._shut_down = True
        run.pulls.close()
        if run.auto_commit is not None:
            await run.auto_commit.stop()
        if run.registered:
            run.instance.unregister_consumer(self.consumer_group)
        for task in run.tasks:
            task.cancel()
        if run.tasks:
            await asyncio.wait(set(run.tasks))
        async with self._rebalance_lock:       # a rebalance in flight finishes first
            await run.pulls.stop_all()
        if self.auto_commit:
            run.offsets.take_positions()
        try:
            await run.offsets.write(run.offsets.stored_positions(), acknowledged=True)
        except MQError as exc:
            log.warning("group %s could not store its offsets at shutdown: %s", self.consumer_group, exc)
        for pq in run.rebalancer.process_queues.values():
            pq.dropped = True
        run.rebalancer.process_queues.clear()
        if run.registered:
            await run.instance.unregister_from_brokers(consumer_group=self.consumer_group)
        await run.instance.release()

    _close = shutdown

    # -- consuming -------------------------------------------------------------------------------

    async def poll(self, timeout_ms: int | None = None) -> list[MessageExt]:
        """What is buffered (at most 10 * `pull_batch_size` messages, each queue's in queue order),
        waiting up to `timeout_ms` (default `poll_timeout_ms`) for something; [] on timeout or at
        shutdown. The consumed position of each queue moves past its last message returned."""
        run = self._require_running()
        timeout_ms = self.poll_timeout_ms if timeout_ms is None else timeout_ms
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms = {timeout_ms} is negative")
        return await run.pulls.take(MAX_POLL_BATCHES * self.pull_batch_size, timeout_ms)

    async def __aiter__(self) -> AsyncIterator[MessageExt]:
        """Messages one at a time until shutdown; each counts as consumed when it is yielded."""
        self._require_running()
        while (run := self._run) is not None:
            for message in await run.pulls.take(1, self.poll_timeout_ms):
                yield message

    def seek(self, queue: MessageQueue, queue_offset: int) -> None:
        """Drop what is buffered for `queue` and pull it again from `queue_offset` (an offset out of
        the queue's range is corrected by the broker's OFFSET_ILLEGAL answer). Raises
        `ClientStateError` when `queue` is not assigned now."""
        if queue_offset < 0:
            raise ValueError(f"queue_offset = {queue_offset} is negative")
        self._seek(queue, queue_offset)

    def seek_to_begin(self, queue: MessageQueue) -> None:
        """`seek` to the queue's min offset (looked up by the queue's pull task)."""
        self._seek(queue, StartFrom.MIN)

    def seek_to_end(self, queue: MessageQueue) -> None:
        """`seek` to the queue's max offset (looked up by the queue's pull task): only messages
        stored after that lookup are delivered."""
        self._seek(queue, StartFrom.MAX)

    async def seek_to_timestamp(self, queue: MessageQueue, timestamp_ms: int) -> None:
        """`seek` to the offset SEARCH_OFFSET_BY_TIMESTAMP gives for `timestamp_ms` (epoch ms; the
        broker's rule of §2.2, not always "the first message stored at or after")."""
        run = self._require_assigned(queue)
        queue_offset = await run.instance.api.search_offset(run.offsets.address_of(queue), queue.topic, queue.queue_id,
                                                            timestamp_ms, self.client_config.request_timeout_ms)
        self._seek(queue, queue_offset)

    def commit(self) -> None:
        """Put every assigned queue's consumed position into the offset store and start writing them
        out in the background (UPDATE_CONSUMER_OFFSET one-way for clustering, the local file for
        broadcasting); failures are logged. `commit_sync` waits and raises."""
        run = self._require_running()
        positions = run.offsets.take_positions()
        if positions:
            self._spawn(run.offsets.write(positions, acknowledged=False), "commit")

    async def commit_sync(self) -> None:
        """As `commit`, but returns once the broker acknowledged every position (clustering) or the
        file is written (broadcasting); raises the first `MQError`."""
        run = self._require_running()
        await run.offsets.write(run.offsets.take_positions(), acknowledged=True)

    async def committed(self, queue: MessageQueue) -> int:
        """The stored offset of `queue` (the broker's for clustering, -1 when it has none; the local
        store's for broadcasting). Raises `MQError` when the broker cannot be asked."""
        return await self._require_running().offsets.committed(queue)

    def assignment(self) -> set[MessageQueue]:
        """The queues pulled now (subscribe: this consumer's share after the last rebalance)."""
        if self._run is not None:
            return set(self._run.pulls.queues())
        return set(self._assigned) if self._mode is _Mode.ASSIGN else set()

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """`topic`'s readable queues, sorted (to `assign`); raises `TopicNotExist`."""
        run = self._require_running()
        await run.instance.update_route(topic)
        queues = sorted(run.instance.routes.subscribe_queues(topic))
        if not queues:
            raise TopicNotExist(topic)
        return queues

    @property
    def client_id(self) -> str | None:
        return self._run.instance.client_id if self._run else None

    # -- what the client instance asks (MemberConsumer) ------------------------------------------

    async def do_rebalance(self) -> None:
        """One rebalance (serialised); a changed assignment is announced by a heartbeat at once."""
        async with self._rebalance_lock:
            run = self._run
            if run is not None and run.registered and await run.rebalancer.do_rebalance():
                await run.instance.send_heartbeat_to_all_brokers()

    async def persist_offsets(self) -> None:
        run = self._run
        if run is not None:
            await run.offsets.store.persist_all(run.pulls.queues())

    # -- internals -------------------------------------------------------------------------------

    def _require_running(self) -> _Running:
        if self._run is None:
            raise ClientStateError("consumer was shut down" if self._shut_down
                                   else "consumer is not started (call start() or use `async with`)")
        return self._run

    def _require_assigned(self, queue: MessageQueue) -> _Running:
        run = self._require_running()
        if not run.pulls.has(queue):
            raise ClientStateError(f"{queue} is not assigned to this consumer")
        return run

    def _seek(self, queue: MessageQueue, start: int | StartFrom) -> None:
        self._require_assigned(queue).pulls.seek(queue, start)

    def _subscription_of(self, topic: str) -> TopicSubscription:
        sub = self._subscriptions.get(topic)
        return sub if sub is not None else TopicSubscription(topic, "*", ExpressionType.TAG, frozenset(), 0)

    async def _join_group(self, run: _Running) -> None:
        """Register (once), learn the routes, heartbeat and rebalance: at start and on (un)subscribe."""
        if not run.registered:
            run.instance.register_consumer(self)
            run.registered = True
        for topic in self._subscriptions:
            try:
                await run.instance.update_route(topic)
            except NoPermission:
                raise
            except MQError as exc:
                log.warning("route of %s unavailable: %s", topic, exc)
        await run.instance.check_client_in_broker(
            self.consumer_group, [s.subscription_data() for s in self._subscriptions.values()])
        await run.instance.send_heartbeat_to_all_brokers()
        try:
            await self.do_rebalance()
        except MQError as exc:      # the periodic rebalance tries again
            log.warning("first rebalance of group %s failed: %s", self.consumer_group, exc)

    def _apply_assignment(self, run: _Running) -> None:
        wanted = set(self._assigned)
        for mq in run.pulls.queues():
            if mq not in wanted:
                run.pulls.discard(mq)
                self._spawn(run.offsets.forget(mq), f"unassign {mq}")
        for mq in sorted(wanted - set(run.pulls.queues())):
            run.pulls.start(mq, ProcessQueue(now_ms=now_ms()), StartFrom.STORED)

    async def _auto_commit(self) -> None:
        run = self._run
        if run is not None:
            await run.offsets.write(run.offsets.take_positions(), acknowledged=False)


    def _spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Run `work` as a task owned by this run (cancelled and awaited at shutdown); failures are logged."""
        run = self._require_running()
        task = asyncio.get_running_loop().create_task(work, name=f"{self.consumer_group} {what}")
        run.tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            run.tasks.discard(task)
            exc = None if task.cancelled() else task.exception()
            if isinstance(exc, MQError):
                log.info("%s of group %s failed: %s", what, self.consumer_group, exc)
            elif exc is not None:
                log.error("%s of group %s failed", what, self.consumer_group, exc_info=exc)

        task.add_done_callback(done)
