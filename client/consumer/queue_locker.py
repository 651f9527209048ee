"""`QueueLocker`: an orderly consumer's broker queue locks (RocketMQ `RebalanceImpl#lock`,
`lockAll`, `unlock`, `unlockAll`; REFERENCE.md §11).

A lock is granted to the consumer's client id; `ProcessQueue.locked` / `last_lock_at_ms` record
what the broker last said, and the consumer trusts it for `lock_max_live_time_ms` (30 s) from the
moment the request was *sent* (RocketMQ stamps the answer's arrival; stamping the send keeps the
client's trust strictly inside the broker's 60 s). Times are monotonic ms."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from client.api import ClientAPI
from client.consumer.process_queue import ProcessQueue
from protocol.errors import MQError
from protocol.model import MessageQueue
from protocol.service import Service

log = logging.getLogger(__name__)
FIRST_RENEWAL_MS = 1_000


class QueueLocker:
    def __init__(self, api: ClientAPI, address_of: Callable[[MessageQueue], str], consumer_group: str,
                 client_id: Callable[[], str], now_ms: Callable[[], int], timeout_ms: int) -> None:
        self._api, self._address_of, self._group = api, address_of, consumer_group
        self._client_id, self._now_ms, self._timeout_ms = client_id, now_ms, timeout_ms

    def _by_broker(self, queues: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
        batches: dict[str, list[MessageQueue]] = defaultdict(list)
        for mq in queues:
            batches[self._address_of(mq)].append(mq)
        return batches

    async def lock(self, mq: MessageQueue) -> int | None:
        """Lock one queue: the monotonic ms the request left when granted, None when another
        client holds it or the broker could not be asked."""
        sent_at_ms = self._now_ms()
        try:
            granted = await self._api.lock_batch_mq(self._address_of(mq), self._group, self._client_id(), [mq],
                                                    self._timeout_ms)
        except MQError as exc:
            log.info("group %s: lock of %s failed: %s", self._group, mq, exc)
            return None
        return sent_at_ms if mq in granted else None

    async def lock_pq(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Lock `mq` and record the answer in `pq` (RocketMQ `lockOneMQ`)."""
        if pq.dropped:
            return False
        locked_at_ms = await self.lock(mq)
        if locked_at_ms is not None and not pq.dropped:
            pq.locked, pq.last_lock_at_ms = True, locked_at_ms
            return True
        return False

    async def lock_all(self, process_queues: Mapping[MessageQueue, ProcessQueue]) -> None:
        """Renew every queue's lock, one request per broker; a queue not granted is marked unlocked
        (its consumption pauses until a lock succeeds). A broker that cannot be asked leaves its
        queues as they are: they expire on this side after `lock_max_live_time_ms`."""
        for address, queues in self._by_broker(sorted(process_queues)).items():
            sent_at_ms = self._now_ms()
            try:
                granted = await self._api.lock_batch_mq(address, self._group, self._client_id(), queues,
                                                        self._timeout_ms)
            except MQError as exc:
                log.info("group %s: renewing %d queue locks on %s failed: %s", self._group, len(queues), address, exc)
                continue
            for mq in queues:
                pq = process_queues.get(mq)
                if pq is None:
                    continue
                if mq in granted:
                    if not pq.locked:
                        log.info("group %s: %s locked again", self._group, mq)
                    pq.locked, pq.last_lock_at_ms = True, sent_at_ms
                elif pq.locked:
                    log.warning("group %s: lost the lock of %s", self._group, mq)
                    pq.locked = False

    async def unlock(self, queues: Iterable[MessageQueue], *, oneway: bool = True) -> None:
        """Release `queues` (one request per broker; failures are logged, expiry frees them)."""
        for address, batch in self._by_broker(queues).items():
            try:
                await self._api.unlock_batch_mq(address, self._group, self._client_id(), batch, oneway=oneway,
                                                timeout_ms=self._timeout_ms)
            except MQError as exc:
                log.info("group %s: unlock of %d queues on %s failed: %s", self._group, len(batch), address, exc)


class LockRenewalService(Service):
    """Renews an orderly consumer's queue locks every `interval_ms` (20 s), the first time after
    `FIRST_RENEWAL_MS` (RocketMQ's `lockAll` schedule in `ConsumeMessageOrderlyService#start`)."""

    name = "lock-renewal"

    def __init__(self, locker: QueueLocker, process_queues: Callable[[], Mapping[MessageQueue, ProcessQueue]],
                 interval_ms: int) -> None:
        super().__init__()
        self._locker, self._process_queues, self._interval_ms = locker, process_queues, interval_ms

    async def run(self) -> None:
        delay_ms = min(FIRST_RENEWAL_MS, self._interval_ms)
        while await self.wait(delay_ms):
            delay_ms = self._interval_ms
            try:
                await self._locker.lock_all(self._process_queues())
            except Exception:
                log.exception("renewing queue locks failed; trying again in %d ms", self._interval_ms)
