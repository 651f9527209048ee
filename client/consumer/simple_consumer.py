"""`SimpleConsumer` (RocketMQ 5's SimpleConsumer, built on POP): the broker hands messages out, each
invisible to the group's other consumers for `invisible_duration_s` and visible again unless acked,
so any number of consumers share a queue with no rebalance.

    consumer = SimpleConsumer("billing", "127.0.0.1:10911", subscriptions={"orders": "*"},
                              await_duration_s=10)
    async with consumer:
        for message in await consumer.receive(16, invisible_duration_s=30):
            handle(message)
            await consumer.ack(message)

The method names and meanings are those of RocketMQ 5's Python client (`receive(max_message_num,
invisible_duration)`, `ack(message)`, `change_invisible_duration(message, invisible_duration)`,
`subscribe`, `unsubscribe`; durations in seconds), as coroutines. Each `receive` pops one
(topic, broker) in turn, round-robin over the subscriptions and the brokers of the topic's route,
with `queue_id` -1 (the broker picks among its queues), held up to `await_duration_s` when nothing
is visible. A message not acked within its invisible duration comes back with `delivery_attempt`
+ 1; past the group's `retry_max_times` (16) it goes to `%DLQ%<group>`. An ack after the handle
expired raises `ReceiptHandleExpired`. FIFO: in a group created with `--fifo`
(`consume_message_orderly`), a queue's next message is handed out only once the previous batch of
that queue is acked (or went to the DLQ); ack a batch's messages in order to keep each message
group's order."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Mapping, Sequence

from client.consumer.message_view import MessageView
from client.consumer.pull_service import TopicSubscription, consumer_data
from client.errors import ClientStateError
from client.instance import ClientInstance, build_client_id, get_instance, parse_endpoints
from client.pop_api import PopAPI
from conf.client import ClientConfig, with_tls
from protocol.bodies import ConsumerData
from protocol.errors import ConnectionClosed, MQError, ResponseError
from protocol.headers_v5 import AckMessageRequestHeader, ChangeInvisibleTimeRequestHeader, PopMessageRequestHeader
from protocol.lifecycle import Lifecycle
from protocol.model import ConsumeFromWhere, ConsumeType, MessageModel
from protocol.signing import Credentials
from protocol.topics import check_group

log = logging.getLogger(__name__)

MAX_RECEIVE_NUM = 32
MAX_INVISIBLE_DURATION_S = 12 * 3600


class SimpleConsumer(Lifecycle):
    """`subscriptions`: topic -> TAG expression ("*", "A || B"). `await_duration_s`: how long a
    `receive` waits for a message (long polling). `credentials=`, `tls=`, `ssl_context=` and
    `client_config=` as `PushConsumer`'s. Raises `ValueError` for a bad group, topic, expression
    or duration."""

    consume_type = ConsumeType.POP

    def __init__(self, consumer_group: str, endpoints: str | Sequence[str], *,
                 subscriptions: Mapping[str, str] | None = None, await_duration_s: float = 20.0,
                 client_config: ClientConfig | None = None, credentials: Credentials | None = None,
                 tls: bool = False, ssl_context: ssl.SSLContext | None = None) -> None:
        remark = check_group(consumer_group)
        if remark is not None:
            raise ValueError(remark)
        if not 0 <= await_duration_s <= 120:
            raise ValueError(f"await_duration_s = {await_duration_s} is out of range [0, 120]")
        self.consumer_group = consumer_group
        self.endpoints = parse_endpoints(endpoints)
        self.await_duration_s = await_duration_s
        self.client_config = with_tls(client_config, tls, ssl_context)
        self.credentials = credentials
        self._subscriptions: dict[str, TopicSubscription] = {}
        for topic, expression in (subscriptions or {}).items():
            self.subscribe(topic, expression)
        self._instance: ClientInstance | None = None
        self._pop: PopAPI | None = None
        self._turn = itertools.count()
        self._shut_down = False
        self._pending_acks: dict[tuple[str, str], list[tuple[MessageView, asyncio.Future[None]]]] = {}
        self._ack_tasks: set[asyncio.Task[None]] = set()

    # -- subscriptions (MemberConsumer) -------------------------------------------------------------

    def subscribe(self, topic: str, filter_expression: str = "*") -> None:
        self._subscriptions[topic] = TopicSubscription.by_tags(topic, filter_expression)

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.pop(topic, None)

    def consumer_data(self) -> ConsumerData:
        return consumer_data(self.consumer_group, self.consume_type, MessageModel.CLUSTERING,
                             ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, self._subscriptions.values())

    def subscribed_topics(self) -> list[str]:
        return list(self._subscriptions)

    async def do_rebalance(self) -> None:
        """Nothing: POP needs no rebalance."""

    async def persist_offsets(self) -> None:
        """Nothing: the broker keeps the pop offsets."""

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, find the subscribed topics' routes and heartbeat as a POP consumer. Raises the
        broker's error for a topic it refuses (`NoPermission`, ...)."""
        if self._shut_down:
            raise ClientStateError("consumer was shut down; create a new one")
        if self._instance is not None:
            return
        client_id = build_client_id(self.client_config.instance_name, unique_default=True)
        instance = get_instance(client_id, self.endpoints, self.client_config, self.credentials)
        instance.register_consumer(self)
        self._instance = instance
        self._pop = PopAPI(instance.remoting)
        try:
            await instance.start()
            for topic in self._subscriptions:
                await instance.update_route(topic)
            await instance.send_heartbeat_to_all_brokers()
        except BaseException:
            await self.shutdown()
            raise

    async def shutdown(self) -> None:
        """Leave the group and close. Messages received and not acked come back after their
        invisible duration (to another consumer of the group)."""
        instance, self._instance = self._instance, None
        if instance is None:
            return
        self._shut_down = True
        if self._ack_tasks:         # acks already sent are answered before the connection closes
            await asyncio.wait(set(self._ack_tasks), timeout=self.client_config.request_timeout_ms / 1000)
        instance.unregister_consumer(self.consumer_group)
        await instance.unregister_from_brokers(consumer_group=self.consumer_group)
        await instance.release()

    _close = shutdown

    def _require(self) -> tuple[ClientInstance, PopAPI]:
        if self._instance is None or self._pop is None:
            raise ClientStateError("consumer is not started")
        return self._instance, self._pop

    # -- consuming --------------------------------------------------------------------------------

    async def receive(self, max_message_num: int, invisible_duration_s: float) -> list[MessageView]:
        """Up to `max_message_num` (1..32) messages, each invisible to the group for
        `invisible_duration_s` seconds; waits up to `await_duration_s` for one; [] when none came
        or the consumer was shut down meanwhile. Raises `ValueError` for out-of-range arguments,
        `ClientStateError` when not started, the broker's error (`NoPermission`, `TopicNotExist`...)."""
        instance, pop = self._require()
        if not 1 <= max_message_num <= MAX_RECEIVE_NUM:
            raise ValueError(f"max_message_num = {max_message_num} is out of range [1, {MAX_RECEIVE_NUM}]")
        invisible_ms = int(invisible_duration_s * 1000)
        if not 1 <= invisible_ms <= MAX_INVISIBLE_DURATION_S * 1000:
            raise ValueError(f"invisible_duration_s = {invisible_duration_s} is out of range (0, 43200]")
        targets = await self._targets(instance)
        if not targets:
            return []
        topic, broker_name, address = targets[next(self._turn) % len(targets)]
        subscription = self._subscriptions[topic]
        poll_ms = int(self.await_duration_s * 1000)
        header = PopMessageRequestHeader(
            consumer_group=self.consumer_group, topic=topic, queue_id=-1, max_msg_nums=max_message_num,
            invisible_time=invisible_ms, poll_time=poll_ms, born_time=0, init_mode=0,
            exp_type=subscription.expression_type, exp=subscription.expression)
        try:
            messages, handles = await pop.pop(address, header, poll_ms + self.client_config.request_timeout_ms)
        except ConnectionClosed:
            if self._shut_down:         # shutdown() during a held receive: it ends empty
                return []
            raise
        return [MessageView(m, h, broker_name, address, invisible_ms)
                for m, h in zip(messages, handles, strict=True)]

    async def _targets(self, instance: ClientInstance) -> list[tuple[str, str, str]]:
        """(topic, broker name, address) for each subscribed topic and each broker serving it."""
        targets: list[tuple[str, str, str]] = []
        for topic in self._subscriptions:
            queues = instance.routes.subscribe_queues(topic)
            if not queues:
                try:
                    await instance.update_route(topic)
                except MQError as exc:
                    log.debug("no route for %s yet: %s", topic, exc)
                queues = instance.routes.subscribe_queues(topic)
            for broker_name in sorted({q.broker_name for q in queues}):
                address = instance.routes.master_address(broker_name) or instance.endpoints[0]
                targets.append((topic, broker_name, address))
        return targets

    def ack(self, message: MessageView) -> asyncio.Future[None]:
        """Acknowledge `message` (`await consumer.ack(message)`): it is not delivered again. The
        awaitable raises `ReceiptHandleExpired` when the invisible duration passed (the message was
        made visible again) or its handle was replaced. Acks made in the same event-loop step
        (`asyncio.gather(*(consumer.ack(m) for m in batch))`) to one broker and topic go in one
        BATCH_ACK_MESSAGE; a lone ack is an ACK_MESSAGE. A future rather than a coroutine: a gather
        of futures makes no task per ack. Raises `ClientStateError` at once when not started."""
        if self._instance is None:
            self._require()             # raises
        key = (message.broker_address, message.topic)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        pending = self._pending_acks.get(key)
        if pending is None:         # the task's first step, next loop step, takes all acks of this one
            pending = self._pending_acks[key] = []
            task = loop.create_task(self._send_acks(key))
            self._ack_tasks.add(task)
            task.add_done_callback(self._ack_tasks.discard)
        pending.append((message, done))
        return done

    async def _send_acks(self, key: tuple[str, str]) -> None:
        items = self._pending_acks.pop(key)
        address, topic = key
        timeout_ms = self.client_config.request_timeout_ms
        try:
            _, pop = self._require()
            if len(items) == 1:
                message = items[0][0]
                await pop.ack_message(address, AckMessageRequestHeader(
                    consumer_group=self.consumer_group, topic=topic, queue_id=message.queue_id,
                    extra_info=message.receipt_handle, offset=message.offset), timeout_ms)
                errors: list[ResponseError | None] = [None]
            else:
                errors = await pop.batch_ack_message(
                    address, self.consumer_group, topic,
                    [(m.queue_id, m.receipt_handle, m.offset) for m, _ in items], timeout_ms)
        except (MQError, ClientStateError) as exc:
            for _, done in items:
                if not done.done():
                    done.set_exception(exc)
            return
        for (_, done), error in zip(items, errors, strict=True):
            if done.done():
                continue
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

    async def change_invisible_duration(self, message: MessageView, invisible_duration_s: float) -> None:
        """Keep `message` invisible for `invisible_duration_s` seconds from now; its
        `receipt_handle` is replaced by the new one. Raises `ReceiptHandleExpired` as `ack`."""
        _, pop = self._require()
        invisible_ms = int(invisible_duration_s * 1000)
        if not 1 <= invisible_ms <= MAX_INVISIBLE_DURATION_S * 1000:
            raise ValueError(f"invisible_duration_s = {invisible_duration_s} is out of range (0, 43200]")
        header = ChangeInvisibleTimeRequestHeader(
            consumer_group=self.consumer_group, topic=message.topic, queue_id=message.queue_id,
            extra_info=message.receipt_handle, offset=message.offset, invisible_time=invisible_ms)
        answer = await pop.change_invisible_time(message.broker_address, header,
                                                 self.client_config.request_timeout_ms)
        message.receipt_handle = answer.extra_info
        message.invisible_duration_ms = invisible_ms
