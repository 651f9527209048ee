"""LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42): orderly consumers' queue locks (REFERENCE.md §11,
RocketMQ `AdminBrokerProcessor#lockBatchMQ/unlockBatchMQ`). Both take a `LockBatchBody`
{consumer_group, client_id, mq_set: [[topic, broker_name, queue_id], ...]}; the lock answers
{lock_ok_mq_set} with the queues the client holds afterwards, the unlock answers nothing. A bad
group or topic name, an empty client id or a malformed body is answered SYSTEM_ERROR."""

from __future__ import annotations

import logging

from broker.locks.lock_manager import LockManager
from broker.processors.validate import require_group_name, require_topic_name
from broker.remoting.context import RequestContext
from protocol.bodies import LockBatchBody, LockBatchResponseBody, decode_body, encode_body
from protocol.command import RemotingCommand
from protocol.errors import SystemError_
from protocol.model import MessageQueue

log = logging.getLogger(__name__)
MAX_QUEUES_PER_REQUEST = 65_536


def _parse(request: RemotingCommand) -> tuple[LockBatchBody, list[MessageQueue]]:
    body = decode_body(LockBatchBody, request.body_bytes())
    require_group_name(body.consumer_group)
    if not body.client_id:
        raise SystemError_("client_id must be a non-empty string")
    if len(body.mq_set) > MAX_QUEUES_PER_REQUEST:
        raise SystemError_(f"mq_set has {len(body.mq_set)} queues; at most {MAX_QUEUES_PER_REQUEST} per request")
    queues = []
    for topic, broker_name, queue_id in body.mq_set:
        require_topic_name(topic)
        if queue_id < 0:
            raise SystemError_(f"queue_id must be ≥ 0, got {queue_id} for {topic}")
        queues.append(MessageQueue(topic, broker_name, queue_id))
    return body, queues


class QueueLockProcessor:
    def __init__(self, locks: LockManager) -> None:
        self._locks = locks

    def lock_batch_mq(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        body, queues = _parse(request)
        granted = self._locks.try_lock_batch(body.consumer_group, queues, body.client_id)
        if len(granted) < len(queues):
            log.debug("group %s: %s asked %d queue locks, got %d", body.consumer_group, body.client_id,
                      len(queues), len(granted))
        answer = LockBatchResponseBody(lock_ok_mq_set=[(mq.topic, mq.broker_name, mq.queue_id)
                                                       for mq in sorted(granted)])
        return request.response(body=encode_body(answer))

    def unlock_batch_mq(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        body, queues = _parse(request)
        released = self._locks.unlock_batch(body.consumer_group, queues, body.client_id)
        log.debug("group %s: %s released %d of %d queue locks", body.consumer_group, body.client_id,
                  len(released), len(queues))
        return request.response()
