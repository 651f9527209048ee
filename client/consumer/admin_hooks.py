"""What a consumer answers to the broker's admin requests (RocketMQ `ClientRemotingProcessor`):
GET_CONSUMER_RUNNING_INFO (its subscriptions and process-queue table) and
RESET_CONSUMER_CLIENT_OFFSET (drop the queues named, store the new offsets, reload them).

`running_info` is pure (values in, a `ConsumerRunningInfo` out); `reset_queues` drives a
`Rebalancer`: for each queue this consumer holds, mark its process queue dropped (so in-flight
results are discarded and commit nothing), put the new offset in the offset store, remove the queue
(which stops its pull and persists that new offset to the broker), then rebalance, which recreates
the queue from the stored offset. RocketMQ also suspends the consumer and waits 10 s first; the
drop-before-store order makes that wait unnecessary here."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from client.consumer.offset_store import OffsetStore
from client.consumer.process_queue import ProcessQueue
from client.consumer.rebalance import Rebalancer
from protocol.bodies import ConsumerData, ConsumerRunningInfo, ProcessQueueInfo
from protocol.model import MessageQueue

log = logging.getLogger(__name__)


def running_info(client_id: str, data: ConsumerData, process_queues: Mapping[MessageQueue, ProcessQueue],
                 offsets: OffsetStore | None, properties: Mapping[str, object],
                 monotonic_to_epoch_ms: int = 0) -> ConsumerRunningInfo:
    """`monotonic_to_epoch_ms` is added to the process queues' instants (monotonic ms) to report
    epoch ms; 0 where none was stamped."""
    def epoch(instant_ms: int) -> int:
        return instant_ms + monotonic_to_epoch_ms if instant_ms > 0 else 0

    table = []
    for mq, pq in sorted(process_queues.items()):
        cached = pq.cached_offset_range()
        committed = offsets.memory_offset(mq) if offsets is not None else None
        table.append(ProcessQueueInfo(
            topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id,
            committed_offset=-1 if committed is None else committed, cached_msg_count=pq.msg_count,
            cached_msg_size_bytes=pq.msg_size_bytes, cached_min_offset=cached[0] if cached else -1,
            cached_max_offset=cached[1] if cached else -1, locked=pq.locked, dropped=pq.dropped,
            last_lock_at_ms=epoch(pq.last_lock_at_ms), last_pull_at_ms=epoch(pq.last_pull_at_ms),
            last_consume_at_ms=epoch(pq.last_consume_at_ms)))
    return ConsumerRunningInfo(client_id=client_id, consumer_group=data.group_name, consume_type=data.consume_type,
                               message_model=data.message_model,
                               properties={key: str(value) for key, value in sorted(properties.items())},
                               subscriptions=list(data.subscription_data_set), mq_table=table)


async def reset_queues(rebalancer: Rebalancer, offsets: OffsetStore, new_offsets: Mapping[MessageQueue, int]) -> int:
    """Drop, re-offset and reload the named queues this consumer holds; returns how many it held.
    The caller serialises this with its rebalances."""
    held = 0
    for mq, queue_offset in sorted(new_offsets.items()):
        pq = rebalancer.process_queues.get(mq)
        if pq is None:
            continue
        held += 1
        pq.dropped = True
        offsets.update_offset(mq, queue_offset, increase_only=False)
        await rebalancer.remove_queue(mq)
        log.info("offset of %s reset to %d; reloading the queue", mq, queue_offset)
    if held:
        await rebalancer.do_rebalance()
    return held
