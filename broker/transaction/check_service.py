"""`TransactionCheckService` (RocketMQ `TransactionalMessageCheckService`): every
`transaction_check_interval_ms`, each half message pending for `transaction_timeout_ms` or more is
checked back: CHECK_TRANSACTION_STATE (one-way) to a live producer of its group, round-robin over
the group's connections (RocketMQ `Broker2Client.checkProducerTransactionState` over
`ProducerManager.getAvailableChannel`), one "c" op record per check. A half checked
`transaction_check_max` times is dropped at the next due pass: copied to TRANS_CHECK_MAX_TIME_TOPIC,
resolved with a "d" op record and counted (`on_dropped`). A check with no live producer of the
group still counts (as RocketMQ: its check-times property grows whether or not a channel was
found), so a group gone for good is dropped within `transaction_check_max` passes."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from broker.registry.producer_manager import ProducerManager
from broker.transaction.bridge import TransactionBridge
from protocol.codes import RequestCode
from protocol.command import request
from protocol.errors import MQError
from protocol.headers_v5 import CheckTransactionStateRequestHeader
from protocol.message import F_PROPERTIES, PROPERTY_UNIQ_KEY, make_msg_id
from protocol.service import Service
from protocol.transaction import PROPERTY_PRODUCER_GROUP

log = logging.getLogger(__name__)
MAX_CHECKS_PER_PASS = 20_000


class TransactionCheckService(Service):
    name = "transaction-check"

    def __init__(self, bridge: TransactionBridge, producers: ProducerManager, *, broker_name: str, store_host: str,
                 interval_ms: int, timeout_ms: int, check_max: int, now_ms: Callable[[], int],
                 on_dropped: Callable[[], None]) -> None:
        super().__init__()
        self._bridge, self._producers = bridge, producers
        self._broker_name, self._store_host = broker_name, store_host
        self._interval_ms, self._timeout_ms, self._check_max = interval_ms, timeout_ms, check_max
        self._now_ms, self._on_dropped = now_ms, on_dropped
        self._round_robin = itertools.count()
        self.checks_sent = 0
        self.dropped = 0

    async def run(self) -> None:
        while await self.wait(self._interval_ms):
            try:
                self.check_once()
            except MQError as exc:           # a store refusal (disk full): the next pass tries again
                log.warning("transaction check pass stopped: %s", exc)
            except Exception:                # anything else: logged, and the service lives on
                log.exception("transaction check pass failed; trying again next interval")
        self._bridge.flush_ops()            # the op records of the last resolutions, before the store stops

    def check_once(self) -> int:
        """One pass; returns the check-backs sent to a producer."""
        bridge = self._bridge
        table = bridge.table
        sent = 0
        for half_offset in table.due(self._now_ms(), self._timeout_ms, MAX_CHECKS_PER_PASS):
            half = table.pending.get(half_offset)
            if half is None:
                continue
            fields = bridge.half_message(half.commit_log_offset)
            if fields is None:              # removed by retention: nothing left to deliver
                log.warning("transaction offset %d: the half message is no longer stored; forgotten", half_offset)
                bridge.remove(half_offset)
                continue
            if half.checks >= self._check_max:
                log.warning("transaction offset %d: dropped after %d check-backs (transaction_check_max)",
                            half_offset, half.checks)
                bridge.drop(half_offset, fields)
                self.dropped += 1
                self._on_dropped()
                continue
            properties = fields[F_PROPERTIES]
            group = properties.get(PROPERTY_PRODUCER_GROUP, "")
            bridge.record_check(half_offset)
            channels = [c for c in self._producers.channels_of(group) if not c.closed and not c.write_paused]
            if not channels:
                log.info("transaction offset %d: no live producer of group %r to check", half_offset, group)
                continue
            channel = channels[next(self._round_robin) % len(channels)]
            uniq_key = properties.get(PROPERTY_UNIQ_KEY)
            header = CheckTransactionStateRequestHeader(
                producer_group=group, topic=properties.get("REAL_TOPIC", ""), tran_state_table_offset=half_offset,
                commit_log_offset=half.commit_log_offset, msg_id=uniq_key, transaction_id=uniq_key,
                offset_msg_id=make_msg_id(self._store_host, half.commit_log_offset), broker_name=self._broker_name)
            body = bridge.check_body(half_offset, fields, half.checks)
            try:
                channel.invoke_oneway(request(RequestCode.CHECK_TRANSACTION_STATE, header, body, oneway=True))
            except MQError as exc:
                log.info("transaction offset %d: check to %s not sent: %s", half_offset, channel, exc)
                continue
            sent += 1
        self.checks_sent += sent
        return sent
