"""What the Spark source asks brokers: a topic's queues and their offset bounds (on the driver), and
the messages of one explicit offset range of one queue (on an executor).

Everything is async on `ClientAPI`; `run_on_private_loop` runs such a coroutine to completion on a
fresh event loop with its own connections, which is how both Spark's driver-side Python process and
each executor task use them (Spark calls us synchronously, from threads and processes that own no
event loop). No consumer group takes part: a range is pulled by explicit queue offsets with the
SUBSCRIPTION flag, so there is no heartbeat, no rebalance and no committed offset (RocketMQ's
`DefaultLitePullConsumer.assign` + `seek`, minus the group's offset store)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import uvloop

from client.api import ClientAPI, PullResult
from client.remoting.remoting_client import RemotingClient
from client.route import RouteTable, merge_routes
from client.spark.arrow import PulledBody
from client.spark.options import NO_TLS, Filter, PullSettings, TlsSettings
from protocol.codes import PullSysFlag
from protocol.errors import MQError, TopicNotExist
from protocol.headers import PullMessageRequestHeader
from protocol.message import F_STORE_TIMESTAMP, STORED_FIELD_COUNT
from protocol.model import PullStatus
from protocol.signing import Credentials

log = logging.getLogger(__name__)
T = TypeVar("T")
READER_GROUP = "rocketq-spark-reader"    # named in pulls; the broker keeps no offset for it
_PULL_SYS_FLAG = int(PullSysFlag.SUBSCRIPTION)


class DataLoss(RuntimeError):
    """Part of a requested offset range is no longer on the broker (below its min offset), or the
    range goes past the queue's end; with failOnDataLoss=false the reader skips instead."""


def remoting_client(tls: TlsSettings, credentials: Credentials | None = None) -> RemotingClient:
    """Connections signing every request with `credentials` when given, over TLS when `tls.enabled`
    (servers verified against `tls.ca_file`, or the system's CAs; `tls.cert_file` presented to servers
    that ask for a client certificate); raises `TlsError` when a file cannot be read."""
    return RemotingClient(credentials=credentials, ssl_context=tls.context())


def run_on_private_loop(work: Callable[[ClientAPI], Awaitable[T]], credentials: Credentials | None = None,
                        tls: TlsSettings = NO_TLS) -> T:
    """`work(api)` on a new uvloop event loop with its own connections (signing every request with
    `credentials` when given, TLS as `tls` says), all closed afterwards."""
    async def main() -> T:
        remoting = remoting_client(tls, credentials)
        try:
            return await work(ClientAPI(remoting))
        finally:
            await remoting.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


@dataclass(frozen=True, slots=True)
class TopicQueues:
    """The read queues of a topic on its (one) broker."""

    address: str
    broker_name: str
    queue_ids: tuple[int, ...]


async def topic_queues(api: ClientAPI, endpoints: tuple[str, ...], topic: str) -> TopicQueues:
    """Asks every endpoint for the topic's route (as `ClientInstance` does) and merges the answers.
    Raises `TopicNotExist` when no broker serves it and `ValueError` when several do: a queue is
    named by its queue id alone in the schema and the checkpointed offsets."""
    routes, last_error = [], None
    for endpoint in endpoints:
        try:
            routes.append(await api.get_route_info(endpoint, topic))
        except MQError as exc:
            last_error = exc
    if not routes:
        raise last_error if last_error is not None else TopicNotExist(topic)
    table = RouteTable()
    table.update(topic, merge_routes(routes))
    queues = table.subscribe_queues(topic)
    brokers = sorted({mq.broker_name for mq in queues})
    if not brokers:
        raise TopicNotExist(topic)
    if len(brokers) > 1:
        raise ValueError(f"topic {topic!r} is served by several brokers ({', '.join(brokers)}); the Spark "
                         "source reads topics of one broker")
    address = table.master_address(brokers[0]) or endpoints[0]
    return TopicQueues(address, brokers[0], tuple(sorted(mq.queue_id for mq in queues)))


async def queue_bounds(api: ClientAPI, address: str, topic: str,
                       queue_ids: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """queue id → (min_offset, max_offset): the first offset still stored and the next one to come."""
    async def bounds(queue_id: int) -> tuple[int, int]:
        return (await api.get_min_offset(address, topic, queue_id),
                await api.get_max_offset(address, topic, queue_id))

    values = await asyncio.gather(*(bounds(q) for q in queue_ids))
    return dict(zip(queue_ids, values, strict=True))


def _header(topic: str, queue_id: int, queue_offset: int, count: int,
            message_filter: Filter) -> PullMessageRequestHeader:
    return PullMessageRequestHeader(consumer_group=READER_GROUP, topic=topic, queue_id=queue_id,
                                    queue_offset=queue_offset, max_msg_nums=count, sys_flag=_PULL_SYS_FLAG,
                                    commit_offset=0, suspend_timeout_ms=0, sub_version=0,
                                    subscription=message_filter.expression,
                                    expression_type=message_filter.expression_type)


def decode_body(body: bytes) -> list[list[Any]]:
    """The stored-message arrays of a pull body; raises `ValueError` on a malformed one."""
    unpacker = msgpack.Unpacker(raw=False, use_list=True, strict_map_key=False, max_buffer_size=max(len(body), 1))
    unpacker.feed(body)
    arrays = list(unpacker)
    for values in arrays:
        if type(values) is not list or len(values) != STORED_FIELD_COUNT:
            raise ValueError("a pull body holds something that is not a stored message")
    return arrays


async def offset_for_timestamp(api: ClientAPI, address: str, topic: str, queue_id: int, timestamp_ms: int,
                               min_offset: int, max_offset: int) -> int:
    """The first queue offset whose message was stored at or after `timestamp_ms` (`max_offset`
    when none was). SEARCH_OFFSET_BY_TIMESTAMP answers RocketMQ's nearest message, which may be
    the last one before: its store time is checked with a one-message pull."""
    if min_offset >= max_offset:
        return max_offset
    queue_offset = await api.search_offset(address, topic, queue_id, timestamp_ms)
    queue_offset = min(max(queue_offset, min_offset), max_offset - 1)
    result, body = await api.pull_message_raw(address, _header(topic, queue_id, queue_offset, 1, Filter()), 10_000)
    if result.status is PullStatus.FOUND:
        (first, *_) = decode_body(body)
        if first[F_STORE_TIMESTAMP] < timestamp_ms:
            return queue_offset + 1
    return queue_offset


class RangePuller:
    """Pulls offsets [start, end) of one queue in order, `settings.depth` pulls of
    `settings.batch_size` in flight, and hands out the bodies of the pulls that found messages,
    still encoded (`client.spark.arrow.record_batch` decodes them into columns and re-checks the
    offsets and the tags)."""

    def __init__(self, api: ClientAPI, address: str, topic: str, queue_id: int, message_filter: Filter,
                 settings: PullSettings) -> None:
        self._api, self._address, self._topic, self._queue_id = api, address, topic, queue_id
        self._filter, self._settings = message_filter, settings

    def _pull(self, queue_offset: int, count: int) -> asyncio.Task[tuple[PullResult, bytes]]:
        header = _header(self._topic, self._queue_id, queue_offset, count, self._filter)
        return asyncio.get_running_loop().create_task(
            self._api.pull_message_raw(self._address, header, self._settings.timeout_ms))

    async def bodies(self, start: int, end: int) -> AsyncGenerator[PulledBody, None]:
        """The found bodies, in queue order, covering [start, end) exactly (each with the offsets
        its pull covered). Raises `DataLoss` (see its doc) when failOnDataLoss is on, and the
        pull's `MQError`s."""
        in_flight: deque[tuple[int, int, asyncio.Task[tuple[PullResult, bytes]]]] = deque()
        next_low = start
        try:
            while True:
                while len(in_flight) < self._settings.depth and next_low < end:
                    high = min(next_low + self._settings.batch_size, end)
                    in_flight.append((next_low, high, self._pull(next_low, high - next_low)))
                    next_low = high
                if not in_flight:
                    return
                low, high, task = in_flight.popleft()
                result, body = await task
                while True:
                    found, low = self._adopt(result, body, low, high)
                    if found is not None:
                        yield found
                    if low >= high:
                        break
                    result, body = await self._pull(low, high - low)
        finally:
            for _, _, task in in_flight:
                task.cancel()
            if in_flight:
                await asyncio.wait([task for _, _, task in in_flight])

    def _adopt(self, result: PullResult, body: bytes, low: int, high: int) -> tuple[PulledBody | None, int]:
        """(the body the pull found in [low, high), if any; where the chunk goes on)."""
        where = f"{self._topic}:{self._queue_id} at {low}"
        found = False
        if result.status is PullStatus.FOUND:
            found, next_low = True, result.next_begin_offset
        elif result.status is PullStatus.NO_MATCHED_MSG:
            next_low = result.next_begin_offset
        elif result.status is PullStatus.NO_NEW_MSG:
            if self._settings.fail_on_data_loss:
                raise DataLoss(f"{where}: the queue ends at {result.max_offset}, before the planned end {high}")
            return None, high
        else:
            if self._settings.fail_on_data_loss or result.next_begin_offset <= low:
                raise DataLoss(f"{where}: offset out of the queue's range [{result.min_offset}, "
                               f"{result.max_offset})")
            log.warning("%s is gone; skipping to %d", where, result.next_begin_offset)
            next_low = result.next_begin_offset
        if next_low <= low:
            raise RuntimeError(f"{where}: the broker answered {result.status.name} without moving on")
        next_low = min(next_low, high)
        return PulledBody(body, low, next_low) if found else None, next_low
