"""Admin requests about a consumer group (RocketMQ `AdminBrokerProcessor` / `Broker2Client`):
GET_CONSUMER_CONNECTION_LIST, GET_CONSUME_STATS, GET_CONSUMER_RUNNING_INFO (forwarded to the
client, which answers with its process-queue state) and INVOKE_BROKER_TO_RESET_OFFSET (new offsets
committed here, then RESET_CONSUMER_CLIENT_OFFSET, one-way, to every consumer of the group, which
drops and reloads the queues; RocketMQ `Broker2Client#resetOffset`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from broker.lag_collector import queue_lag
from broker.offset.consumer_offset_manager import ConsumerOffsetManager
from broker.processors.validate import require_group_name, require_topic_name
from broker.registry.consumer_manager import ConsumerGroupInfo, ConsumerManager
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.topics.topic_config_manager import TopicConfigManager
from protocol.bodies import (
    Connection,
    ConsumerConnection,
    ConsumeStats,
    QueueConsumeStats,
    ResetOffsetBody,
    ResetQueueOffset,
    SubscriptionData,
    encode_body,
)
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.command import request as new_request
from protocol.errors import ConnectionClosed, ConsumerNotOnline, MQError, SystemError_
from protocol.headers import (
    ConsumerGroupRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumeStatsRequestHeader,
    ResetConsumerClientOffsetRequestHeader,
    ResetOffsetRequestHeader,
)

log = logging.getLogger(__name__)
RUNNING_INFO_TIMEOUT_MS = 5_000
TPS_WINDOW_MS = 60_000


def _online(consumers: ConsumerManager, group: str) -> ConsumerGroupInfo:
    info = consumers.get(group)
    if info is None or not info.channels:
        raise ConsumerNotOnline(f"consumer group {group!r} has no consumer online")
    return info


def reset_target(header: ResetOffsetRequestHeader, queue_id: int, before: int, min_offset: int,
                 max_offset: int, offset_at_timestamp: Callable[[], int]) -> int:
    """Where one queue moves: the header's single target, clamped to [min, max]; without `is_force`
    a queue only moves back (RocketMQ: `if (isForce || target < consumerOffset)`). Raises
    `SystemError_` for a header naming no target or several."""
    targets = [header.timestamp >= 0, header.to_where is not None, header.queue_id >= 0]
    if sum(targets) != 1:
        raise SystemError_("name exactly one reset target: timestamp, to_where (EARLIEST|LATEST), "
                           "or queue_id with offset")
    if header.to_where is not None:
        if header.to_where not in ("EARLIEST", "LATEST"):
            raise SystemError_(f"to_where must be EARLIEST or LATEST, got {header.to_where!r}")
        target = min_offset if header.to_where == "EARLIEST" else max_offset
    elif header.timestamp >= 0:
        target = offset_at_timestamp()
    else:
        if header.offset < 0:
            raise SystemError_("offset must be ≥ 0 with queue_id")
        target = header.offset
    target = min(max(target, min_offset), max_offset)
    if not header.is_force and 0 <= before <= target:
        return before
    return target


class ConsumerAdminProcessor:
    def __init__(self, store: MessageStore, topics: TopicConfigManager, consumers: ConsumerManager,
                 offsets: ConsumerOffsetManager, broker_name: str, now_ms: Callable[[], int],
                 monotonic_ms: Callable[[], int]) -> None:
        self._store, self._topics, self._consumers, self._offsets = store, topics, consumers, offsets
        self._broker_name, self._now_ms, self._monotonic_ms = broker_name, now_ms, monotonic_ms
        self._tps_samples: dict[str, tuple[int, int]] = {}     # group → (at_ms, sum of committed offsets)

    async def get_consumer_connection_list(self, ctx: RequestContext,
                                           request: RemotingCommand) -> RemotingCommand:
        """CONSUMER_NOT_ONLINE when the group has no connection."""
        header = ConsumerGroupRequestHeader.from_fields(request.fields)
        info = _online(self._consumers, header.consumer_group)
        to_epoch_ms = self._now_ms() - self._monotonic_ms()        # heartbeats are stamped on the monotonic clock
        connections = [Connection(client_id=c.client_id, client_addr=c.channel.remote_address,
                                  last_heartbeat_ms=c.last_update_ms + to_epoch_ms)
                       for c in sorted(info.channels.values(), key=lambda c: c.client_id)]
        subscriptions = [SubscriptionData(topic=s.topic, sub_string=s.sub_string, expression_type=s.expression_type,
                                          tags_set=sorted(s.tags_set), code_set=sorted(s.code_set),
                                          sub_version=s.sub_version)
                         for s in sorted(info.subscriptions.values(), key=lambda s: s.topic)]
        body = ConsumerConnection(connection_set=connections, subscription_table=subscriptions,
                                  consume_type=info.consume_type.value, message_model=info.message_model.value,
                                  consume_from_where=info.consume_from_where.value)
        return request.response(body=encode_body(body))

    def _topics_of(self, group: str, topic: str | None) -> list[str]:
        """Topics with a committed offset of the group, plus those its online consumers subscribe."""
        topics = {t for g, t, _ in self._offsets.all_offsets() if g == group}
        info = self._consumers.get(group)
        if info is not None:
            topics.update(info.subscriptions)
        return sorted(t for t in topics if (topic is None or t == topic) and self._topics.get(t) is not None)

    async def get_consume_stats(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """Every queue of the group's topics: broker offset, committed offset (0 when none, as
        RocketMQ), pull offset, last consumed store time and lag latency."""
        header = GetConsumeStatsRequestHeader.from_fields(request.fields)
        require_group_name(header.consumer_group)
        now_ms, table = self._now_ms(), []
        for topic in self._topics_of(header.consumer_group, header.topic):
            config = self._topics.require(topic)
            for queue_id in range(config.read_queue_nums):
                committed = self._offsets.query(header.consumer_group, topic, queue_id)
                lag = queue_lag(self._store, self._offsets, now_ms, header.consumer_group, topic, queue_id,
                                max(committed or 0, 0))
                table.append(QueueConsumeStats(
                    topic=topic, broker_name=self._broker_name, queue_id=queue_id, broker_offset=lag.broker_offset,
                    consumer_offset=lag.consumer_offset, pull_offset=-1 if lag.pull_offset is None else lag.pull_offset,
                    last_timestamp=lag.last_timestamp_ms, lag_latency_ms=lag.lag_latency_ms))
        total = sum(q.consumer_offset for q in table)
        previous = self._tps_samples.get(header.consumer_group)
        self._tps_samples[header.consumer_group] = (now_ms, total)
        tps = 0.0
        if previous is not None and 0 < now_ms - previous[0] <= TPS_WINDOW_MS and total >= previous[1]:
            tps = (total - previous[1]) * 1000 / (now_ms - previous[0])
        return request.response(body=encode_body(ConsumeStats(offset_table=table, consume_tps=tps)))

    async def get_consumer_running_info(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """Forward to the client's connection and relay its answer; CONSUMER_NOT_ONLINE when the
        client is not connected, SYSTEM_ERROR when it does not answer in 5 s."""
        header = GetConsumerRunningInfoRequestHeader.from_fields(request.fields)
        info = _online(self._consumers, header.consumer_group)
        channel = next((c.channel for c in info.channels.values() if c.client_id == header.client_id), None)
        if channel is None:
            raise ConsumerNotOnline(f"client {header.client_id!r} is not a consumer of {header.consumer_group!r}")
        try:
            answer = await channel.invoke(new_request(RequestCode.GET_CONSUMER_RUNNING_INFO, header),
                                          RUNNING_INFO_TIMEOUT_MS)
        except MQError as exc:
            raise SystemError_(f"client {header.client_id} did not answer: {exc}") from None
        return request.response(answer.code, body=answer.body_bytes(), remark=answer.remark)

    async def reset_offset(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """Commit the new offsets, tell every online consumer of the group (one-way), answer the
        before/after table. TOPIC_NOT_EXIST for a missing topic; SYSTEM_ERROR for a bad target."""
        header = ResetOffsetRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        require_group_name(header.group)
        config = self._topics.require(header.topic)
        queue_ids = list(range(config.read_queue_nums))
        if header.queue_id >= 0:
            if header.queue_id not in queue_ids:
                raise SystemError_(f"queue_id {header.queue_id} is outside topic {header.topic!r}'s "
                                   f"{config.read_queue_nums} queues")
            queue_ids = [header.queue_id]
        store, rows = self._store, []
        for queue_id in queue_ids:
            before = self._offsets.query(header.group, header.topic, queue_id)
            before = -1 if before is None else before
            after = reset_target(header, queue_id, before, store.get_min_offset(header.topic, queue_id),
                                 store.get_max_offset(header.topic, queue_id),
                                 partial(store.search_offset_by_timestamp, header.topic, queue_id, header.timestamp))
            rows.append(ResetQueueOffset(topic=header.topic, broker_name=self._broker_name, queue_id=queue_id,
                                         before=before, after=after))
        self._offsets.reset(header.group, header.topic, {row.queue_id: row.after for row in rows})
        body = encode_body(ResetOffsetBody(offset_table=rows))
        info = self._consumers.get(header.group)
        for client in list(info.channels.values()) if info is not None else []:
            notify = new_request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                             ResetConsumerClientOffsetRequestHeader(topic=header.topic, group=header.group,
                                                                    timestamp=header.timestamp),
                             body, oneway=True)
            try:
                client.channel.invoke_oneway(notify)
            except ConnectionClosed:
                log.info("reset of %s on %s: %s is gone", header.group, header.topic, client.client_id)
        log.info("offsets of %s on %s reset: %s", header.group, header.topic,
                 {row.queue_id: (row.before, row.after) for row in rows})
        return request.response(body=body)
