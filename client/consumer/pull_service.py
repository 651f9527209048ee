"""`PullService`: one owned task per process queue pulling from the broker (RocketMQ
`DefaultMQPushConsumerImpl#pullMessage`, REFERENCE.md §12): flow control by count, size and span,
long-polling pulls, hand-off to the consume service, `next_begin_offset` adopted for every status,
backoff on errors, and the OFFSET_ILLEGAL procedure. Dropping the queue cancels its task.
An orderly CLUSTERING consumer pulls a queue only while it holds the queue's broker lock (else it
looks again after `pull_time_delay_when_exception_ms`, 3 s) and has no span limit (§11)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from client.api import ClientAPI, PullResult
from client.consumer.message_selector import MessageSelector
from client.consumer.offset_store import OffsetStore
from client.consumer.process_queue import ProcessQueue
from client.consumer.pull_nodes import PullFromWhichNode
from conf.client import PushConsumerOptions
from protocol.bodies import ConsumerData, SubscriptionData
from protocol.codes import PullSysFlag
from protocol.errors import FlowControl, MQError, NoPermission
from protocol.headers import PullMessageRequestHeader
from protocol.message import PROPERTY_MAX_OFFSET, PROPERTY_MIN_OFFSET, PROPERTY_RETRY_TOPIC, MessageExt
from protocol.model import (
    ConsumeFromWhere,
    ConsumeType,
    ExpressionType,
    MessageModel,
    MessageQueue,
    PullStatus,
)
from protocol.subscription import is_subscribe_all, parse_tags, tags_code
from protocol.topics import check_topic, retry_topic

log = logging.getLogger(__name__)
OFFSET_ILLEGAL_DELAY_MS = 10_000
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TopicSubscription:
    topic: str
    expression: str
    expression_type: str
    tags_set: frozenset[str]
    sub_version: int

    @classmethod
    def by_tags(cls, topic: str, expression: str) -> TopicSubscription:
        """A TAG subscription made now; raises `ValueError` for a bad topic name or an expression
        with no tag ("||")."""
        remark = check_topic(topic)
        if remark is not None:
            raise ValueError(remark)
        tags = frozenset() if is_subscribe_all(expression) else parse_tags(expression)
        return cls(topic, expression or "*", ExpressionType.TAG, tags, time.time_ns() // 1_000_000)

    @classmethod
    def of(cls, topic: str, selector: str | MessageSelector) -> TopicSubscription:
        """A subscription made now from a tag-expression string or a `MessageSelector`; raises
        `ValueError` for a bad topic name or tag expression (an SQL92 text is checked by the
        broker, see `MessageSelector`)."""
        if isinstance(selector, str):
            return cls.by_tags(topic, selector)
        if selector.expression_type == ExpressionType.TAG:
            return cls.by_tags(topic, selector.expression)
        if selector.expression_type != ExpressionType.SQL92:
            raise ValueError(f"unknown expression_type {selector.expression_type!r} (TAG or SQL92)")
        remark = check_topic(topic)
        if remark is not None:
            raise ValueError(remark)
        return cls(topic, selector.expression, ExpressionType.SQL92, frozenset(), time.time_ns() // 1_000_000)

    def subscription_data(self) -> SubscriptionData:
        """As a heartbeat carries it."""
        return SubscriptionData(topic=self.topic, sub_string=self.expression, expression_type=self.expression_type,
                                tags_set=sorted(self.tags_set), code_set=sorted(tags_code(t) for t in self.tags_set),
                                sub_version=self.sub_version)


def consumer_data(group: str, consume_type: ConsumeType, message_model: MessageModel,
                  consume_from_where: ConsumeFromWhere, subscriptions: Iterable[TopicSubscription]) -> ConsumerData:
    """A consumer's entry in a heartbeat."""
    return ConsumerData(group_name=group, consume_type=consume_type.value, message_model=message_model.value,
                        consume_from_where=consume_from_where.value,
                        subscription_data_set=[s.subscription_data() for s in subscriptions])


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ConsumeService(Protocol):
    """Where pulled messages go: `ConcurrentConsumeService` or `OrderlyConsumeService`."""

    def submit(self, pq: ProcessQueue, mq: MessageQueue, messages: list[MessageExt]) -> None: ...


def flow_control_delay_ms(pq: ProcessQueue, options: PushConsumerOptions, *, check_span: bool = True) -> int:
    """0 to pull now, else the delay RocketMQ applies: 50 ms when the cache holds more than
    `pull_threshold_for_queue` messages, more than `pull_threshold_size_for_queue` MiB (integer
    division), or (`check_span`: concurrent consumers) spans more than
    `consume_concurrently_max_span` offsets."""
    if pq.msg_count > options.pull_threshold_for_queue:
        return options.pull_time_delay_when_flow_control_ms
    if pq.msg_size_bytes // MIB > options.pull_threshold_size_for_queue:
        return options.pull_time_delay_when_flow_control_ms
    if check_span and pq.max_span > options.consume_concurrently_max_span:
        return options.pull_time_delay_when_flow_control_ms
    return 0


def refilter(messages: list[MessageExt], tags_set: frozenset[str]) -> list[MessageExt]:
    """Keep messages whose tag string is in `tags_set` (removes tags-code collisions, §5)."""
    if not tags_set:
        return messages
    return [m for m in messages if m.properties.get("TAGS") in tags_set]


class PullService:
    def __init__(self, api: ClientAPI, address_of: Callable[[MessageQueue], str], consumer_group: str,
                 options: PushConsumerOptions, message_model: MessageModel, offset_store: OffsetStore,
                 consume_service: ConsumeService,
                 subscription_of: Callable[[str], TopicSubscription | None],
                 remove_queue: Callable[[MessageQueue], Awaitable[None]],
                 paused: Callable[[], bool], *, orderly: bool = False,
                 route_failed: Callable[[str], None] | None = None, nodes: PullFromWhichNode | None = None) -> None:
        """`nodes`: which broker of the replica set each queue is pulled from (the brokers'
        suggestions); None: always `address_of(mq)`."""
        self._api, self._group = api, consumer_group
        self._nodes = nodes if nodes is not None else PullFromWhichNode(address_of, lambda name, broker_id: None)
        self._retry_topic = retry_topic(consumer_group)
        self._orderly = orderly
        self._route_failed = route_failed          # a pull error asks for a fresh route of the topic
        self._needs_lock = orderly and message_model is MessageModel.CLUSTERING
        self._options, self._model = options, message_model
        self._offsets, self._consume = offset_store, consume_service
        self._subscription_of, self._remove_queue, self._paused = subscription_of, remove_queue, paused
        self._tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._next_offsets: dict[MessageQueue, int] = {}
        self._timers: set[asyncio.Task[None]] = set()
        self.pulled_messages = 0
        self.flow_control_times = 0          # pulls put off by flow control (RocketMQ queueFlowControlTimes)

    def start(self, mq: MessageQueue, pq: ProcessQueue, queue_offset: int) -> None:
        if mq in self._tasks:
            raise RuntimeError(f"{mq} is already being pulled")
        task = asyncio.get_running_loop().create_task(self._pull_loop(mq, pq, queue_offset),
                                                      name=f"pull {mq.topic}:{mq.queue_id}")
        self._tasks[mq] = task
        task.add_done_callback(lambda t: self._tasks.pop(mq, None) if self._tasks.get(mq) is t else None)

    async def stop(self, mq: MessageQueue) -> None:
        self._next_offsets.pop(mq, None)
        task = self._tasks.pop(mq, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait({task})

    async def stop_all(self) -> None:
        tasks = list(self._tasks.values()) + list(self._timers)
        self._tasks.clear()
        self._next_offsets.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _header(self, mq: MessageQueue, queue_offset: int, sub: TopicSubscription) -> PullMessageRequestHeader:
        sys_flag = PullSysFlag.SUSPEND
        commit_offset = 0
        if self._model is MessageModel.CLUSTERING:
            memory = self._offsets.memory_offset(mq) or 0
            if memory > 0:
                commit_offset = memory
                sys_flag |= PullSysFlag.COMMIT_OFFSET
        if self._options.post_subscription_when_pull:
            sys_flag |= PullSysFlag.SUBSCRIPTION
        return PullMessageRequestHeader(
            consumer_group=self._group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=queue_offset,
            max_msg_nums=self._options.pull_batch_size, sys_flag=sys_flag, commit_offset=commit_offset,
            suspend_timeout_ms=self._options.broker_suspend_max_ms, sub_version=sub.sub_version,
            subscription=sub.expression, expression_type=sub.expression_type)

    def next_pull_offset(self, mq: MessageQueue) -> int | None:
        """The queue offset `mq`'s next pull asks for (RocketMQ `PullRequest.nextOffset`); None when
        `mq` is not being pulled."""
        return self._next_offsets.get(mq)

    async def restart(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """Replace `mq`'s pull task with a new one that goes on from the next pull offset, keeping
        `pq` (its cached messages and the listener calls on them): what the rebalance does for a pull
        that stalled. RocketMQ drops and recreates the process queue instead, which rewinds to the
        committed offset and throws away the results of the calls in flight."""
        queue_offset = self._next_offsets.get(mq)
        await self.stop(mq)
        if queue_offset is not None and not pq.dropped:
            pq.last_pull_at_ms = now_ms()
            self.start(mq, pq, queue_offset)

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, queue_offset: int) -> None:
        options = self._options
        next_offsets = self._next_offsets
        while not pq.dropped:
            next_offsets[mq] = queue_offset
            # Stamped before every check, as RocketMQ's pullMessage does: a queue paused by flow
            # control, a suspend or a missing lock is waiting, not stalled.
            pq.last_pull_at_ms = now_ms()
            if self._paused():
                await asyncio.sleep(options.pull_time_delay_when_suspend_ms / 1000)
                continue
            if self._needs_lock and not pq.locked:
                await asyncio.sleep(options.pull_time_delay_when_exception_ms / 1000)
                continue
            delay_ms = flow_control_delay_ms(pq, options, check_span=not self._orderly)
            if delay_ms:
                self.flow_control_times += 1
                await asyncio.sleep(delay_ms / 1000)
                continue
            sub = self._subscription_of(mq.topic)
            if sub is None:
                await asyncio.sleep(options.pull_time_delay_when_exception_ms / 1000)
                continue
            try:
                result = await self._nodes.pull(self._api, mq, self._header(mq, queue_offset, sub),
                                                options.consumer_timeout_when_suspend_ms)
            except FlowControl:
                await asyncio.sleep(0.02)
                continue
            except MQError as exc:          # NO_PERMISSION (credentials, ACL) said louder
                log.log(logging.WARNING if isinstance(exc, NoPermission) else logging.INFO,
                        "pull of %s failed: %s; retrying in %d ms", mq, exc, options.pull_time_delay_when_exception_ms)
                if self._route_failed is not None:
                    self._route_failed(mq.topic)
                await asyncio.sleep(options.pull_time_delay_when_exception_ms / 1000)
                continue
            except Exception:               # a bug must not end the queue's pulls for good
                log.exception("pull of %s failed unexpectedly; retrying in %d ms", mq,
                              options.pull_time_delay_when_exception_ms)
                await asyncio.sleep(options.pull_time_delay_when_exception_ms / 1000)
                continue
            if pq.dropped:
                return
            queue_offset = result.next_begin_offset
            if result.status is PullStatus.FOUND:
                self._found(mq, pq, result, sub)
                if options.pull_interval_ms:
                    await asyncio.sleep(options.pull_interval_ms / 1000)
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset of %s is illegal; resetting to %d in %d ms", mq, queue_offset,
                            OFFSET_ILLEGAL_DELAY_MS)
                pq.dropped = True
                timer = asyncio.get_running_loop().create_task(self._reset_offset(mq, queue_offset))
                self._timers.add(timer)
                timer.add_done_callback(self._timers.discard)
                return
            elif pq.msg_count == 0:        # NO_NEW_MSG / NO_MATCHED_MSG: correctTagsOffset
                self._offsets.update_offset(mq, queue_offset, increase_only=True)

    def _found(self, mq: MessageQueue, pq: ProcessQueue, result: PullResult, sub: TopicSubscription) -> None:
        messages = refilter(result.messages, sub.tags_set)
        if not messages:
            return
        min_offset, max_offset = str(result.min_offset), str(result.max_offset)
        for message in messages:
            props = message.properties
            props[PROPERTY_MIN_OFFSET] = min_offset
            props[PROPERTY_MAX_OFFSET] = max_offset
        if mq.topic == self._retry_topic:      # resetRetryAndNamespace: the listener sees the original topic
            for message in messages:
                message.topic = message.properties.get(PROPERTY_RETRY_TOPIC) or message.topic
        self.pulled_messages += len(messages)
        pq.put_messages(messages)
        self._consume.submit(pq, mq, messages)

    async def _reset_offset(self, mq: MessageQueue, queue_offset: int) -> None:
        await asyncio.sleep(OFFSET_ILLEGAL_DELAY_MS / 1000)
        self._offsets.update_offset(mq, queue_offset, increase_only=False)
        await self._offsets.persist(mq)
        await self._remove_queue(mq)
