"""Chaos fault "heartbeat flood": many fake client ids heartbeating into one consumer group.

    result = await heartbeat_flood(broker.address, duration_s=10, pid=broker.pid, client_ids=5_000)

Given a running broker (e.g. a `BrokerSubprocess`: its `address`, and its `pid` to sample RSS),
`heartbeat_flood` opens one raw TCP connection per fake client id, each heartbeating as a PUSH
consumer of `group` (subscribing `topic`): first a join storm (connect and heartbeat `batch` at a
time, as fast as they connect), then each fake again every `interval_s` (spread evenly over the
interval; a real client heartbeats every 30 s) until `duration_s` is over; meanwhile a probe
producer sends to `topic` one message at a time. Every fake reads its connection: heartbeat
answers are counted as accepted or refused (SYSTEM_BUSY: a bound of the broker),
NOTIFY_CONSUMER_IDS_CHANGED frames as notices. It
returns a `HeartbeatFloodResult`: heartbeats sent, accepted and refused, notices received, the
probe's send latency (p99 and max, ms) and the broker's peak RSS. `store_path` is accepted for the
signature every fault shares and is not used by this one. Raises `OSError` when the broker cannot
be reached at all; nothing else.

`FakeMember` is one such connection, usable on its own (tests use it)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData, encode_body
from protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from protocol.command import request
from protocol.frame import FrameDecoder, encode_frame_bytes
from protocol.headers import SendMessageRequestHeader

RSS_SAMPLE_S = 0.1


class FakeMember:
    """One raw connection heartbeating as consumer `client_id` of `group`: `heartbeat()` writes
    one HEART_BEAT; a reader task counts the answers (`accepted`, `refused` with the last refusal's
    `remark`) and the NOTIFY_CONSUMER_IDS_CHANGED frames (`notices`)."""

    def __init__(self, client_id: str, group: str, topic: str) -> None:
        self.client_id = client_id
        body = encode_body(HeartbeatData(client_id=client_id, consumer_data_set=[
            ConsumerData(group_name=group, subscription_data_set=[SubscriptionData(topic=topic)])]))
        self._heartbeat = request(RequestCode.HEART_BEAT, body=body)
        self.accepted = self.refused = self.notices = self.sent = 0
        self.remark = ""
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None

    async def connect(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        reader, self._writer = await asyncio.open_connection(host, int(port))
        self._reader_task = asyncio.create_task(self._read(reader))

    @property
    def answers(self) -> int:
        """Heartbeats answered so far."""
        return self.accepted + self.refused

    def heartbeat(self) -> None:
        if self._writer is None or self._writer.is_closing():
            return
        self.sent += 1
        self._writer.write(encode_frame_bytes(dataclasses.replace(self._heartbeat, opaque=self.sent)))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        decoder = FrameDecoder()
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65_536):
                for command in decoder.feed(chunk):
                    if not command.flag & FLAG_RESPONSE:
                        self.notices += command.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
                    elif command.code == ResponseCode.SUCCESS:
                        self.accepted += 1
                    else:
                        self.refused += 1
                        self.remark = command.remark or ""

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)


@dataclass(frozen=True, slots=True)
class HeartbeatFloodResult:
    client_ids: int          # fake client ids (one connection each)
    heartbeats: int          # heartbeats sent by them
    accepted: int            # answered SUCCESS
    refused: int             # answered otherwise (SYSTEM_BUSY past a bound)
    notices: int             # NOTIFY_CONSUMER_IDS_CHANGED frames they received
    sends: int               # probe sends completed
    p99_send_ms: float       # probe send latency during the flood
    max_send_ms: float
    peak_rss_bytes: int      # of the broker's `pid` (0 without one)


async def heartbeat_flood(address: str, store_path: Path | None = None, duration_s: float = 10.0, *,
                          pid: int | None = None, client_ids: int = 1_000, group: str = "chaos_flood",
                          topic: str = "chaos_flood", batch: int = 100,
                          interval_s: float = 1.0) -> HeartbeatFloodResult:
    """Apply the fault for `duration_s` (plus the time to connect every fake) and measure it."""
    members = [FakeMember(f"flood-{n:05d}", group, topic) for n in range(client_ids)]
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    latencies_ms: list[float] = []
    peak_rss = [0]
    stop = asyncio.Event()
    background = [asyncio.create_task(_probe(api, address, topic, latencies_ms, stop))]
    if pid is not None:
        background.append(asyncio.create_task(_sample_rss(pid, peak_rss, stop)))
    try:
        deadline = time.monotonic() + duration_s
        for start in range(0, len(members), batch):
            await asyncio.gather(*(m.connect(address) for m in members[start:start + batch]))
            for member in members[start:start + batch]:
                member.heartbeat()
        pause_s = interval_s * batch / max(len(members), 1)
        while time.monotonic() < deadline:
            for start in range(0, len(members), batch):
                for member in members[start:start + batch]:
                    member.heartbeat()
                await asyncio.sleep(pause_s)
    finally:
        stop.set()
        await asyncio.gather(*background, return_exceptions=True)
        await asyncio.gather(*(m.close() for m in members))
        await remoting.close()
    latencies_ms.sort()
    return HeartbeatFloodResult(
        client_ids=client_ids, heartbeats=sum(m.sent for m in members), accepted=sum(m.accepted for m in members),
        refused=sum(m.refused for m in members), notices=sum(m.notices for m in members), sends=len(latencies_ms),
        p99_send_ms=latencies_ms[int(len(latencies_ms) * 0.99)] if latencies_ms else 0.0,
        max_send_ms=latencies_ms[-1] if latencies_ms else 0.0, peak_rss_bytes=peak_rss[0])


async def _probe(api: ClientAPI, address: str, topic: str, latencies_ms: list[float], stop: asyncio.Event) -> None:
    header = SendMessageRequestHeader(producer_group="chaos_probe", topic=topic, queue_id=0, flag=0,
                                      born_timestamp=0, properties={})
    while not stop.is_set():
        started = time.perf_counter()
        await api.send_message(address, header, b"probe")
        latencies_ms.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.005)


async def _sample_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RSS_SAMPLE_S)
