"""`Producer` (RocketMQ `DefaultMQProducer`): sends to a topic's queues round-robin, or to the queue a
selector picks, retrying a failed send on another queue `retry_times_when_send_failed` times (2)."""

from __future__ import annotations

import itertools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from client.api import SendResult
from client.errors import ClientStateError
from client.instance import ClientInstance, build_client_id, get_instance, local_ip, parse_endpoints
from client.metrics import ClientMetrics
from client.producer.latency_fault import LatencyFaultTolerance, select_queue
from client.producer.selector import MessageQueueSelector, SelectMessageQueueByHash
from client.producer.uniq_id import UniqIdGenerator
from conf.client import ClientConfig, with_tls
from protocol.errors import ConnectionClosed, MQError, RequestTimeout, ResponseError
from protocol.headers import SendBatchMessageRequestHeader
from protocol.lifecycle import Lifecycle
from protocol.message import PROPERTY_UNIQ_KEY, BatchItem, Message, encode_batch_items
from protocol.model import MessageQueue
from protocol.signing import Credentials
from protocol.topics import check_group, check_topic

log = logging.getLogger(__name__)
# Broker answers after which RocketMQ's sync send tries another queue.
_RETRY_CODES = {1, 2, 16, 17}   # SYSTEM_ERROR, SYSTEM_BUSY, NO_PERMISSION, TOPIC_NOT_EXIST


_BY_HASH = SelectMessageQueueByHash()      # a message with a message_group goes to the queue of its hash

class Producer(Lifecycle):
    """`async with Producer("pg", "127.0.0.1:10911") as producer: await producer.send(Message(...))`.

    Raises `ClientStateError` when used before `start()` or after `shutdown()`, `ValueError` for a
    bad topic or group name, and the last send error when every attempt failed.

    `credentials=Credentials(access_key, secret_key)` signs every request (brokers and name servers
    with authentication on refuse unsigned ones); a refusal, wrong secret or missing ACL, is
    `NoPermission` (code 16) from `send`, its remark saying which and, for an ACL, the resource.
    `tls=True` connects over TLS, verifying servers with the system's CAs; `ssl_context=`
    (`conf.tls.client_context(ca_file=..., cert_file=..., key_file=...)`) with a CA of your own or a
    client certificate (mutual TLS)."""

    def __init__(self, producer_group: str, endpoints: str | Sequence[str], *,
                 retry_times_when_send_failed: int = 2, send_msg_timeout_ms: int = 3_000,
                 default_topic_queue_nums: int = 4, max_message_bytes: int = 4 * 1024 * 1024,
                 send_latency_fault_enable: bool = False, metrics_port: int = 0,
                 client_config: ClientConfig | None = None, credentials: Credentials | None = None,
                 tls: bool = False, ssl_context: ssl.SSLContext | None = None) -> None:
        remark = check_group(producer_group)
        if remark is not None:
            raise ValueError(remark)
        self.producer_group = producer_group
        self.endpoints = parse_endpoints(endpoints)
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.send_msg_timeout_ms = send_msg_timeout_ms
        self.default_topic_queue_nums = default_topic_queue_nums
        self.max_message_bytes = max_message_bytes
        self.client_config = with_tls(client_config, tls, ssl_context)
        self.credentials = credentials
        self._instance: ClientInstance | None = None
        self._round_robin = itertools.count()
        self.send_latency_fault_enable = send_latency_fault_enable
        self._faults = LatencyFaultTolerance() if send_latency_fault_enable else None
        self.metrics_port = metrics_port           # > 0: serve the client's metrics (send cost) there
        self._metrics: ClientMetrics | None = None
        self._uniq = UniqIdGenerator(local_ip())

    async def start(self) -> None:
        if self._instance is not None:
            return
        client_id = build_client_id(self.client_config.instance_name, unique_default=True)
        instance = get_instance(client_id, self.endpoints, self.client_config, self.credentials)
        instance.producer_groups.add(self.producer_group)
        if self.metrics_port > 0:
            self._metrics = instance.serve_metrics(self.metrics_port)
        await instance.start()
        self._instance = instance
        await instance.send_heartbeat_to_all_brokers()

    async def shutdown(self) -> None:
        instance, self._instance = self._instance, None
        if instance is None:
            return
        instance.producer_groups.discard(self.producer_group)
        await instance.unregister_from_brokers(producer_group=self.producer_group)
        await instance.release()

    _close = shutdown

    # -- sending ------------------------------------------------------------------------------------

    def _require_instance(self) -> ClientInstance:
        if self._instance is None:
            raise ClientStateError("producer is not started (call start() or use `async with`)")
        return self._instance

    async def _publish_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's write queues; for a topic no broker knows yet, `default_topic_queue_nums`
        queues on every broker the endpoints know (GET_BROKER_CLUSTER_INFO: a broker creates the
        topic on the first send when `auto_create_topic` is on; RocketMQ's TBW102 route does the
        same), else on the first endpoint."""
        instance = self._require_instance()
        queues = instance.routes.publish_queues(topic)
        if queues:
            return queues
        await instance.update_route(topic)
        queues = instance.routes.publish_queues(topic)
        if queues:
            return queues
        brokers = await instance.cluster_brokers()
        names = [broker.broker_name for broker in brokers] or [""]
        return [MessageQueue(topic, name, i) for name in names for i in range(self.default_topic_queue_nums)]

    def _address_of(self, mq: MessageQueue) -> str:
        instance = self._require_instance()
        return instance.routes.master_address(mq.broker_name) or instance.endpoints[0]

    def _validate(self, message: Message) -> None:
        remark = check_topic(message.topic)
        if remark is not None:
            raise ValueError(remark)
        if not isinstance(message.body, bytes | bytearray):
            raise TypeError("message body must be bytes")
        if len(message.body) > self.max_message_bytes:
            raise ValueError(f"message body of {len(message.body)} bytes exceeds {self.max_message_bytes}")

    async def send(self, message: Message, selector: MessageQueueSelector | None = None, arg: Any = None,
                   *, queue: MessageQueue | None = None) -> SendResult:
        """Send one message and wait for the broker's acknowledgement (after its fsync in
        SYNC_FLUSH). With `selector`, the queue is `selector.select(queues, message, arg)` and a
        failure is not retried elsewhere (ordering would break), as RocketMQ.

        The usual send (no selector or queue, a known route, no latency fault tolerance) is
        `_with_retries`'s first attempt written out here: the next queue round-robin (what
        `select_queue` picks with no failed broker), awaited inline, the retry loop entered only
        after a failure (`_retry`). Each coroutine layer, lambda and queue rotation this skips
        was paid on every send, which costs ~12 µs of client CPU in all."""
        self._validate(message)
        properties = message.wire_properties()
        properties.setdefault(PROPERTY_UNIQ_KEY, self._uniq.next_id())
        instance = self._require_instance()
        queues = instance.routes.publish_queues(message.topic)
        if message.message_group and queue is None and selector is None:     # FIFO: one queue per group
            selector, arg = _BY_HASH, message.message_group
        if not queues or queue is not None or selector is not None or self._faults is not None:
            return await self._send_selected(message, properties, selector, arg, queue)
        target = queues[next(self._round_robin) % len(queues)]
        started = time.monotonic_ns() // 1_000_000 if self._metrics is not None else 0
        address = instance.routes.master_address(target.broker_name) or instance.endpoints[0]
        try:
            result = await instance.api.send_message_to(address, target, self.producer_group, bytes(message.body),
                                                        properties, message.flag, self.send_msg_timeout_ms)
        except (ConnectionClosed, RequestTimeout, ResponseError) as exc:
            error: MQError = exc
        else:
            if self._metrics is not None:
                self._observe(message.topic, started, ok=True)
            return result
        return await self._retry(message.topic, target, started, error,
                                 lambda mq: self._send_to(mq, message, properties))

    async def _send_selected(self, message: Message, properties: dict[str, str],
                             selector: MessageQueueSelector | None, arg: Any, queue: MessageQueue | None) -> SendResult:
        """`send` to the queue given or selected (one attempt), or through `_with_retries`."""
        queues = await self._publish_queues(message.topic)
        if queue is not None or selector is not None:
            target = queue if queue is not None else selector.select(queues, message, arg)  # type: ignore[union-attr]
            return await self._send_to(target, message, properties)
        return await self._with_retries(message.topic, queues, lambda mq: self._send_to(mq, message, properties))

    async def _retry(self, topic: str, target: MessageQueue, started_ms: int, error: MQError,
                     attempt: Callable[[MessageQueue], Awaitable[SendResult]]) -> SendResult:
        """After a first attempt written out inline (`send`, `send_batch`) failed on `target` with
        `error`: what `_with_retries` does after its first attempt (raise a non-retriable error,
        else the remaining attempts)."""
        self._observe(topic, started_ms, ok=False)
        if isinstance(error, ResponseError) and error.code not in _RETRY_CODES:
            raise error
        queues = await self._after_failure(topic, target, 0, error)
        return await self._with_retries(topic, queues, attempt, first_attempt=1, failed_broker=target.broker_name,
                                        last_error=error)

    async def _with_retries(self, topic: str, queues: list[MessageQueue],
                            attempt: Callable[[MessageQueue], Awaitable[SendResult]],
                            fixed: MessageQueue | None = None, *, first_attempt: int = 0,
                            failed_broker: str | None = None, last_error: MQError | None = None) -> SendResult:
        """Up to 1 + `retry_times_when_send_failed` attempts (1 with a `fixed` queue), each on the
        queue `select_queue` picks: round-robin, never the broker that just failed when there is
        another, avoiding slow or failed brokers with `send_latency_fault_enable`. A failure asks
        the client for a fresh route. Raises the last error. `first_attempt`, `failed_broker` and
        `last_error` resume after attempts already made (`_retry`)."""
        for attempt_no in range(first_attempt, 1 if fixed is not None else 1 + self.retry_times_when_send_failed):
            started = time.monotonic_ns() // 1_000_000
            target = fixed or select_queue(queues, next(self._round_robin), failed_broker, self._faults, started)
            try:
                result = await attempt(target)
            except (ConnectionClosed, RequestTimeout) as exc:
                self._observe(topic, started, ok=False)
                last_error = exc
            except ResponseError as exc:
                self._observe(topic, started, ok=False)
                if exc.code not in _RETRY_CODES:
                    raise
                last_error = exc
            else:
                self._observe(topic, started, ok=True)
                if self._faults is not None:
                    now = time.monotonic_ns() // 1_000_000
                    self._faults.update(target.broker_name, now - started, now)
                return result
            failed_broker = target.broker_name
            queues = await self._after_failure(topic, target, attempt_no, last_error)
        assert last_error is not None
        raise last_error

    async def _after_failure(self, topic: str, target: MessageQueue, attempt_no: int,
                             error: MQError) -> list[MessageQueue]:
        """After a failed attempt on `target`: avoid its broker (fault tolerance), log, and return
        the topic's queues from a fresh route."""
        if self._faults is not None:
            self._faults.update(target.broker_name, 0, time.monotonic_ns() // 1_000_000, isolation=True)
        log.info("send to %s failed (attempt %d): %s", target, attempt_no + 1, error)
        self._require_instance().route_failed(topic)
        return await self._publish_queues(topic)

    def _observe(self, topic: str, started_ms: int, *, ok: bool) -> None:
        if self._metrics is not None:
            self._metrics.observe_send(topic, (time.monotonic_ns() // 1_000_000 - started_ms) / 1000, ok)

    async def _send_to(self, mq: MessageQueue, message: Message, properties: dict[str, str]) -> SendResult:
        instance = self._require_instance()
        return await instance.api.send_message_to(self._address_of(mq), mq, self.producer_group,
                                                  bytes(message.body), properties, message.flag,
                                                  self.send_msg_timeout_ms)

    async def send_batch(self, messages: Sequence[Message], *, queue: MessageQueue | None = None) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE to one queue (consecutive queue
        offsets); retried on another queue like `send`. Raises `ValueError` for an empty batch or
        mixed topics. The usual batch (no queue given, a known route, no latency fault tolerance)
        takes its first attempt inline, as `send` does."""
        if not messages:
            raise ValueError("send_batch needs at least one message")
        topic = messages[0].topic
        self._validate(messages[0])
        max_bytes = self.max_message_bytes
        uniq_keys = []
        items: list[BatchItem] = []
        fresh_ids = self._uniq.next_ids(len(messages))
        # One pass: `_validate` of each (the topic checked once: it is the same), then its UNIQ_KEY
        # and wire item. Nothing is sent, and no message keeps a key, unless every message is valid.
        for m in messages:
            body = m.body
            if m.topic != topic:
                raise ValueError("all messages of a batch must have the same topic")
            if m.delay_level:
                raise ValueError("batched messages cannot have a delay level")
            if m.deliver_time_ms is not None or m.delay_time_ms is not None:
                raise ValueError("batched messages cannot have a deliver or delay time: send timer messages one by one")
            if type(body) is not bytes and not isinstance(body, bytes | bytearray):
                raise TypeError("message body must be bytes")
            if len(body) > max_bytes:
                raise ValueError(f"message body of {len(body)} bytes exceeds {max_bytes}")
            props = dict(m.properties) if m.properties else {}
            uniq_keys.append(props.setdefault(PROPERTY_UNIQ_KEY, fresh_ids[len(items)]))
            # the wire properties are `props` itself unless TAGS or KEYS add to them (no DELAY here)
            items.append((props, m.flag, body))
        for index, m in enumerate(messages):
            m.properties = items[index][0]
            if m.tags or m.keys:
                items[index] = (m.wire_properties(), m.flag, m.body)
        body = encode_batch_items(items)
        instance = self._require_instance()
        keys = tuple(uniq_keys)

        def attempt(target: MessageQueue) -> Awaitable[SendResult]:
            header = SendBatchMessageRequestHeader(producer_group=self.producer_group, topic=topic,
                                                   queue_id=target.queue_id,
                                                   born_timestamp=time.time_ns() // 1_000_000)
            return instance.api.send_batch(self._address_of(target), header, body, self.send_msg_timeout_ms,
                                           broker_name=target.broker_name, uniq_keys=keys)
        queues = instance.routes.publish_queues(topic)
        if not queues or queue is not None or self._faults is not None:
            return await self._with_retries(topic, await self._publish_queues(topic), attempt, fixed=queue)
        target = queues[next(self._round_robin) % len(queues)]
        started = time.monotonic_ns() // 1_000_000 if self._metrics is not None else 0
        try:
            result = await attempt(target)
        except (ConnectionClosed, RequestTimeout, ResponseError) as exc:
            error: MQError = exc
        else:
            if self._metrics is not None:
                self._observe(topic, started, ok=True)
            return result
        return await self._retry(topic, target, started, error, attempt)
