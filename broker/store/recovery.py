"""Start-up recovery (RocketMQ `DefaultMessageStore#recover`, REFERENCE.md §4.5), pure of asyncio.

1. Commit log: walk records from the checkpoint's flushed offset (without a checkpoint: the last
   segment's start after a clean stop, the first segment's start after a crash), validating each;
   after a crash (`abort` present) the walk also decodes every payload and the torn tail is zeroed.
2. Consume queues: load, then drop units pointing at or past the commit log's end, and after a
   crash also units at or past the checkpoint's reput offset (their files may have holes).
3. `reput_from_offset`: the checkpoint's reput offset (the first segment's start without one),
   lowered to where any queue that lags the checkpoint's queue maxima (e.g. its directory was
   deleted) stops, so re-dispatch rebuilds it; duplicates are skipped by `ConsumeQueue.append`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from broker.store.checkpoint import Checkpoint
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import ConsumeQueueTable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    commit_log_end: int          # the commit log's write position after truncation
    reput_from_offset: int       # the lowest commit-log offset whose consume-queue unit may be missing


def recover_store(commit_log: CommitLog, consume_queues: ConsumeQueueTable, checkpoint: Checkpoint | None,
                  *, crashed: bool) -> RecoveryResult:
    """Run steps 1-3 on loaded-but-unrecovered parts (blocking file work: run it in a thread)."""
    commit_log.load()
    if checkpoint is not None:
        walk_from = checkpoint.commit_log_flushed_offset
    elif crashed or not commit_log.segment_starts:
        walk_from = commit_log.min_offset
    else:
        walk_from = commit_log.segment_starts[-1]
    end = commit_log.recover(walk_from, deep=crashed)
    min_offset = commit_log.min_offset

    consume_queues.load()
    cut = min(end, checkpoint.reput_offset) if crashed and checkpoint is not None else end
    for queue in consume_queues.queues.values():
        queue.truncate_from_commit_log_offset(cut)
        queue.correct_min_offset(min_offset)

    reput_from = checkpoint.reput_offset if checkpoint is not None else min_offset
    if checkpoint is not None:
        for (topic, queue_id), max_offset in checkpoint.queue_max_offsets.items():
            lagging = consume_queues.get(topic, queue_id)
            if lagging is None or lagging.max_offset < max_offset:
                have = lagging.max_offset if lagging is not None else 0
                lag_from = lagging.max_commit_log_end if lagging is not None else 0
                lag_from = lag_from or min_offset
                log.warning("consume queue %s:%d lags the checkpoint (%d < %d); rebuilding from %d",
                            topic, queue_id, have, max_offset, lag_from)
                reput_from = min(reput_from, lag_from)
    reput_from = min(max(reput_from, min_offset), end)
    log.info("store recovered (%s): commit log [%d, %d), reput from %d, %d consume queues",
             "after a crash" if crashed else "clean", min_offset, end, reput_from, len(consume_queues.queues))
    return RecoveryResult(commit_log_end=end, reput_from_offset=reput_from)
