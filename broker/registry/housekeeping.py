"""`HousekeepingService`: closes channels with no heartbeat for `channel_expired_timeout_ms`
(RocketMQ `ClientHousekeepingService`, 120 s, scanned every 10 s)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.registry.consumer_manager import ConsumerManager
from broker.registry.producer_manager import ProducerManager
from protocol.channel import Channel
from protocol.clock import Clock
from protocol.service import Service

log = logging.getLogger(__name__)


class HousekeepingService(Service):
    name = "housekeeping"

    def __init__(self, consumers: ConsumerManager, producers: ProducerManager, clock: Clock,
                 expired_timeout_ms: int, interval_ms: int,
                 on_expired: Callable[[Channel], None]) -> None:
        super().__init__()
        self._consumers, self._producers, self._clock = consumers, producers, clock
        self._timeout_ms, self._interval_ms, self._on_expired = expired_timeout_ms, interval_ms, on_expired

    def scan(self) -> list[Channel]:
        """Expire silent channels now; returns them (used by the loop and by tests)."""
        now_ms = self._clock.monotonic_ms()
        expired = set(self._consumers.expired_channels(now_ms, self._timeout_ms))
        expired.update(self._producers.expired_channels(now_ms, self._timeout_ms))
        for channel in expired:
            log.info("closing %s: no heartbeat for %d ms", channel, self._timeout_ms)
            self._on_expired(channel)
        return list(expired)

    async def run(self) -> None:
        while await self.wait(self._interval_ms):
            self.scan()
