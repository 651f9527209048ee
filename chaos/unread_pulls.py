"""Fault kind "unread pulls" (issue 35): connections that pipeline PULL_MESSAGE requests for large
messages and never read a response, against a running broker, while a probe producer and consumer
on a connection of their own go on. What the fault costs is measured, not judged:

    async with BrokerSubprocess(store_dir, settings={"max_buffered_bytes": str(32 << 20)}) as broker:
        report = await unread_pulls(broker.address, broker.pid, duration_s=2.0)
    assert report.peak_rss_bytes - report.baseline_rss_bytes < (32 << 20) + (48 << 20)
    assert report.probe_failures == 0

`unread_pulls` first fills queue 0 of `topic` up to `messages` messages of `message_bytes` (when it
holds fewer), takes the broker's RSS (baseline), then opens `connections` raw TCP connections that
each write `pulls_per_connection` pulls at once (each for up to 32 messages from a different
offset, with their own subscription, so no heartbeat is needed) and never read. For `duration_s`
it samples the broker's RSS and runs the probe: a send to `probe_topic` and a pull of it, one
after the other, each timed. Then it closes the connections and polls (bounded by `settle_s`)
until the RSS is back within `settle_margin_bytes` of the baseline. Before issue 35 the broker
computed every response it was asked for: 10 connections x 500 pulls of 150 KB messages took it
from 85 MB to 1,052 MB, and 827 MB stayed after they closed."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import cast

import psutil

from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.codes import PullSysFlag, RequestCode
from protocol.command import request
from protocol.errors import MQError, TopicNotExist
from protocol.frame import encode_frame_bytes
from protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader

_SAMPLE_EVERY_S = 0.02          # probe pacing and RSS sampling interval
_SEED_CONCURRENCY = 16          # sends in flight while filling the topic (they share fsyncs)
_PROBE_TIMEOUT_MS = 5_000


@dataclass(frozen=True, slots=True)
class UnreadPullsReport:
    """RSS of the broker (bytes): before the fault, its peak during it, and after the connections
    closed (`settled_after_s` later; equal to `settle_s` when it never came within the margin).
    Probe: round trips (a send, then a pull) completed and failed, and their latencies' p99 (ms)."""

    baseline_rss_bytes: int
    peak_rss_bytes: int
    after_rss_bytes: int
    settled_after_s: float
    probe_round_trips: int
    probe_failures: int
    probe_p99_ms: float


def pull_frame(topic: str, opaque: int, queue_offset: int, group: str = "unread-pulls",
               suspend_timeout_ms: int = 0) -> bytes:
    """One PULL_MESSAGE frame of queue 0 of `topic` from `queue_offset`, carrying its subscription;
    held up to `suspend_timeout_ms` (SUSPEND) when that is positive."""
    sys_flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_timeout_ms > 0 else 0)
    header = PullMessageRequestHeader(
        consumer_group=group, topic=topic, queue_id=0, queue_offset=queue_offset, max_msg_nums=32,
        sys_flag=int(sys_flag), commit_offset=0, suspend_timeout_ms=suspend_timeout_ms, sub_version=0,
        subscription="*", expression_type="TAG")
    command = request(RequestCode.PULL_MESSAGE, header)
    command.opaque = opaque
    return encode_frame_bytes(command)


async def fill_topic(api: ClientAPI, address: str, topic: str, messages: int, message_bytes: int) -> None:
    """Send to queue 0 of `topic` until it holds `messages` messages of `message_bytes`."""
    try:
        have = await api.get_max_offset(address, topic, 0)
    except TopicNotExist:
        have = 0
    header = SendMessageRequestHeader(producer_group="unread-pulls", topic=topic, queue_id=0, properties={})
    body = bytes(message_bytes)
    for start in range(have, messages, _SEED_CONCURRENCY):
        count = min(_SEED_CONCURRENCY, messages - start)
        await asyncio.gather(*(api.send_message(address, header, body) for _ in range(count)))


async def unread_pulls(address: str, pid: int, *, duration_s: float = 2.0, connections: int = 10,
                       pulls_per_connection: int = 500, topic: str = "unread_pulls", messages: int = 300,
                       message_bytes: int = 150 * 1024, probe_topic: str = "unread_pulls_probe",
                       settle_s: float = 10.0, settle_margin_bytes: int = 16 << 20) -> UnreadPullsReport:
    """Apply the fault to the broker at `address` (process `pid`) for `duration_s`; see the module
    docstring. Raises `MQError` when the topic cannot be filled (the broker does not take sends)."""
    broker = psutil.Process(pid)
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    writers: list[asyncio.StreamWriter] = []
    try:
        await fill_topic(api, address, topic, messages, message_bytes)
        await _probe(api, address, probe_topic, 0)       # the probe's topic and connection exist
        baseline = peak = broker.memory_info().rss
        host, port = address.rsplit(":", 1)
        for index in range(connections):
            _, writer = await asyncio.open_connection(host, int(port))
            cast(asyncio.Transport, writer.transport).pause_reading()      # never read a response
            writer.write(b"".join(pull_frame(topic, opaque, (index * 37 + opaque * 7) % messages)
                                  for opaque in range(1, pulls_per_connection + 1)))
            writers.append(writer)
        latencies_ms: list[float] = []
        failures = 0
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            try:
                latencies_ms.append(await _probe(api, address, probe_topic, len(latencies_ms) + 1))
            except MQError:
                failures += 1
            peak = max(peak, broker.memory_info().rss)
            await asyncio.sleep(_SAMPLE_EVERY_S)        # pacing, not synchronisation
        for writer in writers:
            writer.transport.abort()
        writers.clear()
        settled_at = time.monotonic()
        after = broker.memory_info().rss
        while after > baseline + settle_margin_bytes and time.monotonic() - settled_at < settle_s:
            await asyncio.sleep(_SAMPLE_EVERY_S)
            after = broker.memory_info().rss
        return UnreadPullsReport(
            baseline_rss_bytes=baseline, peak_rss_bytes=peak, after_rss_bytes=after,
            settled_after_s=time.monotonic() - settled_at, probe_round_trips=len(latencies_ms),
            probe_failures=failures, probe_p99_ms=_p99(latencies_ms))
    finally:
        for writer in writers:
            writer.transport.abort()
        await remoting.close()


async def _probe(api: ClientAPI, address: str, topic: str, queue_offset: int) -> float:
    """A send to `topic` and a pull of the message it stored (`queue_offset`): milliseconds taken."""
    started = time.perf_counter()
    header = SendMessageRequestHeader(producer_group="unread-pulls-probe", topic=topic, queue_id=0, properties={})
    await api.send_message(address, header, b"probe", _PROBE_TIMEOUT_MS)
    pull = PullMessageRequestHeader(
        consumer_group="unread-pulls-probe", topic=topic, queue_id=0, queue_offset=queue_offset, max_msg_nums=1,
        sys_flag=int(PullSysFlag.SUBSCRIPTION), commit_offset=0, suspend_timeout_ms=0, sub_version=0,
        subscription="*", expression_type="TAG")
    result = await api.pull_message(address, pull, _PROBE_TIMEOUT_MS)
    if not result.messages:
        raise MQError(f"the probe's pull of {topic}:0 at {queue_offset} found nothing ({result.status})")
    return (time.perf_counter() - started) * 1000


def _p99(values_ms: list[float]) -> float:
    if not values_ms:
        return 0.0
    ordered = sorted(values_ms)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
