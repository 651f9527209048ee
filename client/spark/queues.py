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
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import uvloop

from client.api import ClientAPI, PullResult
from client.remoting.remoting_client import RemotingClient
from client.route import RouteTable, merge_routes
from client.spark.arrow import PulledBody
from client.spark.options import NO_TLS, Filter, PullSettings, QueueKey, TlsSettings
from protocol.bodies import TopicRouteData
from protocol.codes import PullSysFlag
from protocol.errors import ConnectionClosed, MQError, RequestTimeout, TopicNotExist
from protocol.headers import PullMessageRequestHeader
from protocol.message import F_STORE_TIMESTAMP, STORED_FIELD_COUNT
from protocol.model import PullStatus
from protocol.signing import Credentials

log = logging.getLogger(__name__)
T = TypeVar("T")
READER_GROUP = "rocketq-spark-reader"    # named in pulls; the broker keeps no offset for it
_PULL_SYS_FLAG = int(PullSysFlag.SUBSCRIPTION)


class BrokerUnavailable(RuntimeError):
    """A broker the read needs did not answer within brokerWaitTimeoutMs."""


BROKER_UNAVAILABLE = (ConnectionClosed, RequestTimeout)   # a broker down or unreachable: worth waiting for


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


async def wait_for_broker(call: Callable[[], Awaitable[T]], what: str, wait_ms: int) -> T:
    """`call()`, called again while it raises `BROKER_UNAVAILABLE` (backing off 0.1 s to 2 s),
    for at most `wait_ms`; then raises `BrokerUnavailable` naming `what`. A broker that is down,
    restarting or failing over delays a read this way instead of having its queues skipped."""
    loop = asyncio.get_running_loop()
    deadline, delay_s = loop.time() + wait_ms / 1000, 0.1
    while True:
        try:
            return await call()
        except BROKER_UNAVAILABLE as exc:
            left_s = deadline - loop.time()
            if left_s <= 0:
                raise BrokerUnavailable(f"{what}: no answer within brokerWaitTimeoutMs={wait_ms}: {exc}") from exc
            log.warning("%s: %s; retrying for %.0f s more", what, exc, left_s)
            await asyncio.sleep(min(delay_s, left_s))    # a back-off between attempts, not a synchronisation
            delay_s = min(delay_s * 2, 2.0)


@dataclass(frozen=True, slots=True)
class TopicQueues:
    """The read queues of a topic on every broker serving it: `queues` sorted (broker name, queue
    id), `addresses` broker name → its master's address."""

    addresses: Mapping[str, str]
    queues: tuple[QueueKey, ...]

    @property
    def broker_names(self) -> list[str]:
        return sorted(self.addresses)

    def address(self, broker_name: str) -> str:
        """The master address of `broker_name`; raises `KeyError` for a broker not in the route."""
        return self.addresses[broker_name]


NO_QUEUES = TopicQueues({}, ())


async def topic_queues(api: ClientAPI, endpoints: tuple[str, ...], topic: str, wait_ms: int = 0) -> TopicQueues:
    """Asks every endpoint (name servers or brokers) for the topic's route, as `ClientInstance`
    does, and merges the answers. While no endpoint answers at all, retries for up to `wait_ms`
    (`wait_for_broker`). Raises `TopicNotExist` when no broker serves the topic."""
    async def ask_all() -> list[TopicRouteData]:
        routes, unavailable = [], None
        for endpoint in endpoints:
            try:
                routes.append(await api.get_route_info(endpoint, topic))
            except BROKER_UNAVAILABLE as exc:
                unavailable = exc
            except TopicNotExist:
                pass
        if not routes and unavailable is not None:
            raise unavailable
        return routes

    routes = await wait_for_broker(ask_all, f"route of {topic!r} from {';'.join(endpoints)}", wait_ms)
    table = RouteTable()
    table.update(topic, merge_routes(routes))
    queues = table.subscribe_queues(topic)
    if not queues:
        raise TopicNotExist(topic)
    addresses = {}
    for broker_name in sorted({mq.broker_name for mq in queues}):
        address = table.master_address(broker_name)
        if address is None and len(endpoints) == 1:
            address = endpoints[0]
        if address is not None:
            addresses[broker_name] = address
    return TopicQueues(addresses, tuple(sorted((mq.broker_name, mq.queue_id) for mq in queues
                                               if mq.broker_name in addresses)))


async def queue_bounds(api: ClientAPI, queues: TopicQueues, topic: str,
                       wait_ms: int = 0) -> dict[QueueKey, tuple[int, int]]:
    """(broker name, queue id) → (min_offset, max_offset): the first offset still stored and the
    next one to come; a broker that does not answer is waited for (`wait_for_broker`)."""
    async def bounds(queue: QueueKey) -> tuple[int, int]:
        broker_name, queue_id = queue
        address = queues.address(broker_name)

        async def ask() -> tuple[int, int]:
            return (await api.get_min_offset(address, topic, queue_id),
                    await api.get_max_offset(address, topic, queue_id))

        return await wait_for_broker(ask, f"offsets of {topic}:{broker_name}:{queue_id} at {address}", wait_ms)

    values = await asyncio.gather(*(bounds(q) for q in queues.queues))
    return dict(zip(queues.queues, values, strict=True))


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
                 settings: PullSettings, resolve: Callable[[], Awaitable[str]] | None = None) -> None:
        """`resolve()`: the queue's broker's master address now (from the routes); asked again
        after a pull found no broker at `address`, so a read follows an HA failover (the new
        master has the same broker name and queue offsets)."""
        self._api, self._address, self._topic, self._queue_id = api, address, topic, queue_id
        self._filter, self._settings, self._resolve = message_filter, settings, resolve

    async def _follow_master(self) -> None:
        if self._resolve is None:
            return
        try:
            address = await self._resolve()
        except (KeyError, MQError, *BROKER_UNAVAILABLE):     # no route yet: the same address again
            return
        if address != self._address:
            log.warning("%s:%d: its broker moved from %s to %s", self._topic, self._queue_id, self._address, address)
            self._address = address

    def _pull(self, queue_offset: int, count: int) -> asyncio.Task[tuple[PullResult, bytes]]:
        header = _header(self._topic, self._queue_id, queue_offset, count, self._filter)
        async def pull() -> tuple[PullResult, bytes]:
            try:
                return await self._api.pull_message_raw(self._address, header, self._settings.timeout_ms)
            except BROKER_UNAVAILABLE:
                await self._follow_master()
                raise

        what = f"pull of {self._topic}:{self._queue_id} at {queue_offset} from {self._address}"
        return asyncio.get_running_loop().create_task(wait_for_broker(pull, what, self._settings.broker_wait_ms))

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
