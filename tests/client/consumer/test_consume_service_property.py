"""The process queue and the concurrent consume service together, as a state machine under random
listener timings, batch sizes, failures, send-back answers, flow control and drops (a rebalance
taking the queue away and giving it back from the committed offset), then a graceful stop.

What must hold (RocketMQ `ProcessQueue.removeMessage` and `processConsumeResult`):
- every offset committed has everything below it finished (consumed, or taken by the broker's
  send-back) by the process queue that committed it: nothing unfinished is ever committed;
- the committed offset never goes back;
- a message is consumed twice only after it failed or its queue was dropped;
- left alone, the committed offset reaches the end; after a graceful stop it stands exactly at the
  lowest offset the live process queue had not finished, and no listener call started after it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from client.consumer.consume_concurrently import ConcurrentConsumeService
from client.consumer.listener import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus
from client.consumer.process_queue import ProcessQueue
from protocol.message import MessageExt
from protocol.model import MessageModel, MessageQueue

MQ = MessageQueue("t", "b", 0)


@dataclass
class Run:
    """What the listener, the send-back and the offset store saw, shared with worker threads."""

    outcomes: list[bool]                      # per call, in call order: succeed or fail (cycled)
    send_back_ok: list[bool]                  # per send-back, cycled
    delays_s: list[float]                     # per call, cycled
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0
    send_backs: int = 0
    consumed: Counter[int] = field(default_factory=Counter)
    failed: set[int] = field(default_factory=set)
    finished: dict[int, set[int]] = field(default_factory=dict)    # generation -> offsets finished
    committed: int = 0
    started_after_stop: list[int] = field(default_factory=list)
    stopping: bool = False
    generation_of: dict[int, int] = field(default_factory=dict)     # id(message) -> generation

    def next_call(self, msgs: list[MessageExt]) -> tuple[bool, float]:
        with self.lock:
            if self.stopping:
                self.started_after_stop.extend(m.queue_offset for m in msgs)
            index = self.calls
            self.calls += 1
        return self.outcomes[index % len(self.outcomes)], self.delays_s[index % len(self.delays_s)]

    def record(self, msgs: list[MessageExt], ok: bool) -> None:
        with self.lock:
            for m in msgs:
                if ok:
                    self.consumed[m.queue_offset] += 1
                    self.finished.setdefault(self.generation_of[id(m)], set()).add(m.queue_offset)
                else:
                    self.failed.add(m.queue_offset)


def messages(first: int, count: int, generation: int, run: Run) -> list[MessageExt]:
    batch = [MessageExt(topic="t", body=b"x" * (o % 5 + 1), queue_id=0, queue_offset=o) for o in
             range(first, first + count)]
    for m in batch:
        run.generation_of[id(m)] = generation
    return batch


def lowest_unfinished(done: set[int], start: int) -> int:
    offset = start
    while offset in done:
        offset += 1
    return offset


async def scenario(run: Run, *, total: int, pull_batch: int, consume_batch: int, threads: int, is_async: bool,
                   threshold: int, drops: list[int], stop_after: int | None) -> None:
    generation = 0
    pq = ProcessQueue(now_ms=0)
    pq_start = {0: 0}

    def update_offset(mq: MessageQueue, queue_offset: int) -> None:
        # the increase-only store of RemoteBrokerOffsetStore, checked on every update
        gen = generation
        done = run.finished.get(gen, set())
        assert lowest_unfinished(done, pq_start[gen]) >= queue_offset, \
            f"committed {queue_offset} past an unfinished message (generation {gen})"
        assert queue_offset >= run.committed, "the committed offset went back"
        run.committed = max(run.committed, queue_offset)

    def sync_listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        ok, delay = run.next_call(msgs)
        time.sleep(delay)
        run.record(msgs, ok)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS if ok else ConsumeConcurrentlyStatus.RECONSUME_LATER

    async def async_listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        ok, delay = run.next_call(msgs)
        await asyncio.sleep(delay)
        run.record(msgs, ok)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS if ok else ConsumeConcurrentlyStatus.RECONSUME_LATER

    async def send_back(message: MessageExt, mq: MessageQueue, delay_level: int) -> bool:
        with run.lock:
            ok = run.send_back_ok[run.send_backs % len(run.send_back_ok)]
            run.send_backs += 1
            if ok:      # the broker took it: it is finished here (it comes back via the retry topic)
                run.finished.setdefault(run.generation_of[id(message)], set()).add(message.queue_offset)
        return ok

    service = ConcurrentConsumeService(
        async_listener if is_async else sync_listener, consume_thread_max=threads, batch_max_size=consume_batch,
        reconsume_later_delay_ms=2, message_model=MessageModel.CLUSTERING, update_offset=update_offset,
        consumer_group="g", send_back=send_back)
    next_offset, pulls = 0, 0
    async with asyncio.timeout(20):
        while next_offset < total:
            while pq.msg_count > threshold:                     # flow control
                await asyncio.sleep(0.001)
            batch = messages(next_offset, min(pull_batch, total - next_offset), generation, run)
            pq.put_messages(batch)
            service.submit(pq, MQ, batch)
            next_offset += len(batch)
            pulls += 1
            if pulls in drops:                                  # rebalance: dropped, then given back
                pq.dropped = True
                generation += 1
                pq = ProcessQueue(now_ms=0)
                next_offset = pq_start[generation] = run.committed
            if stop_after is not None and pulls == stop_after:
                break
            await asyncio.sleep(0)
        if stop_after is None:
            while run.committed < total:
                await asyncio.sleep(0.001)
    run.stopping = True
    await service.shutdown(await_termination_ms=10_000)
    assert not run.started_after_stop, "a listener call started after the stop"
    if stop_after is None:
        assert run.committed == total and pq.msg_count == 0 and pq.msg_size_bytes == 0
    else:   # the graceful stop waited for the running calls: committed = the live queue's lowest unfinished
        expected = lowest_unfinished(run.finished.get(generation, set()), pq_start[generation])
        assert run.committed == min(expected, next_offset), (run.committed, expected, next_offset)
    if not drops:
        twice = {o for o, n in run.consumed.items() if n > 1}
        assert twice <= run.failed, f"consumed twice without a failure: {sorted(twice - run.failed)}"


@settings(max_examples=30, deadline=None)
@given(total=st.integers(1, 48), pull_batch=st.integers(1, 16), consume_batch=st.integers(1, 8),
       threads=st.integers(1, 4), is_async=st.booleans(), threshold=st.integers(1, 20),
       outcomes=st.lists(st.booleans(), min_size=1, max_size=8).map(lambda xs: [*xs, True]),
       send_back_ok=st.lists(st.booleans(), min_size=1, max_size=4),
       delays_ms=st.lists(st.sampled_from([0, 0, 1, 3, 15]), min_size=1, max_size=6),
       drops=st.lists(st.integers(1, 6), max_size=2), stop_after=st.none() | st.integers(1, 6))
def test_consume_service_commits_only_finished_messages(total: int, pull_batch: int, consume_batch: int, threads: int,
                                                        is_async: bool, threshold: int, outcomes: list[bool],
                                                        send_back_ok: list[bool], delays_ms: list[int],
                                                        drops: list[int], stop_after: int | None) -> None:
    run = Run(outcomes=outcomes, send_back_ok=send_back_ok, delays_s=[d / 1000 for d in delays_ms])
    asyncio.run(scenario(run, total=total, pull_batch=pull_batch, consume_batch=consume_batch, threads=threads,
                         is_async=is_async, threshold=threshold, drops=drops, stop_after=stop_after))
