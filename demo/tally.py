"""`Tally`: what the push consumers saw, deduplicated by the message's unique key (at-least-once
delivery may hand a message over twice, e.g. around a rebalance)."""

from __future__ import annotations

import asyncio
import json
import time

from client import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, MessageExt
from demo.flights import CarrierStats


class Tally:
    """Counts flights and sums `dep_delay` per carrier from message bodies (the row as JSON keyed by
    the CSV header). `done` is set once `target` distinct messages were seen.

    Only touched from the event loop (the listener is async), so it needs no lock."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.per_carrier: dict[str, CarrierStats] = {}
        self.duplicates = 0
        self.undecodable = 0        # bodies that are not a JSON object with carrier and dep_delay
        self.wrong_tag_or_key = 0   # TAGS != carrier or KEYS != tailnum
        self.done = asyncio.Event()
        self.done_at_s = 0.0            # time.perf_counter() when the last distinct message came in
        self._seen: set[str] = set()
        if target <= 0:
            self.done.set()

    @property
    def unique(self) -> int:
        return len(self._seen)

    async def listener(self, msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        """The consumers' listener: never asks for a redelivery (a bad body is counted, not retried)."""
        self.add(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def add(self, msgs: list[MessageExt]) -> None:
        for msg in msgs:
            key = msg.uniq_key or msg.msg_id
            if key in self._seen:
                self.duplicates += 1
                continue
            self._seen.add(key)
            self._count(msg)
        if len(self._seen) >= self.target and not self.done.is_set():
            self.done_at_s = time.perf_counter()
            self.done.set()

    def _count(self, msg: MessageExt) -> None:
        try:
            row = json.loads(msg.body)
            carrier, dep_delay = row["carrier"], row["dep_delay"]
            self.per_carrier.setdefault(carrier, CarrierStats()).add(dep_delay)
        except (ValueError, TypeError, KeyError):
            self.undecodable += 1
            return
        if msg.tags != carrier or (msg.keys or "") != row.get("tailnum", ""):
            self.wrong_tag_or_key += 1
