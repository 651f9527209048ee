"""`bench.inproc`'s harness: a `Broker` in this process fed pre-encoded request frames through a
transport that drops what is written (`InProcess`, `DroppingTransport`), the frames' builders
(`send_frame`, `batch_frame`) and the helpers the workloads share."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import operator
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from auth.model import AclEntry, Resource, User
from broker.broker import Broker
from client.api import send_message_fields
from conf.auth import AuthConfig
from conf.broker import BrokerConfig
from conf.store import StoreConfig
from conf.trace import TraceConfig
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.frame import encode_frame_bytes
from protocol.headers import SendBatchMessageRequestHeader
from protocol.message import Message, encode_batch_body
from protocol.signing import Credentials, sign

BODY = bytes(128)
QUEUES = 8
UNIQ = {"UNIQ_KEY": "7F000001000000000000000000000001"}
PRODUCER = Credentials("inproc", "inproc-secret")


class DroppingTransport(asyncio.Transport):
    """A transport that accepts every write and sends nothing; `writes` counts the calls. Closing
    it tells the protocol given by `set_protocol` that the connection is lost, as a socket's
    transport does (the broker waits for that at its stop)."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.writes = 0
        self._port = port
        self._protocol: asyncio.BaseProtocol | None = None
        self._closing = False

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def write(self, data: Any) -> None:
        self.writes += 1

    def writelines(self, list_of_data: Any) -> None:
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", self._port) if name in ("peername", "sockname") else default

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            if self._protocol is not None:
                asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)


def _encoded(cmd: RemotingCommand, credentials: Credentials | None) -> bytes:
    if credentials is not None:
        sign(cmd, credentials)
    return encode_frame_bytes(cmd)


def send_frame(topic: str, queue_id: int, opaque: int, body: bytes = BODY, uniq_key: str = UNIQ["UNIQ_KEY"],
               credentials: Credentials | None = None) -> bytes:
    fields = send_message_fields("pg", topic, queue_id, 0, int(time.time() * 1000), {"UNIQ_KEY": uniq_key})
    return _encoded(RemotingCommand(int(RequestCode.SEND_MESSAGE), opaque=opaque, fields=fields, body=body),
                    credentials)


def batch_frame(topic: str, queue_id: int, opaque: int, size: int = 32, credentials: Credentials | None = None
                ) -> bytes:
    """A SEND_BATCH of `size` messages whose UNIQ_KEYs no other frame with another `opaque` has."""
    header = SendBatchMessageRequestHeader(producer_group="pg", topic=topic, queue_id=queue_id, born_timestamp=0)
    messages = [Message(topic=topic, body=BODY, properties={"UNIQ_KEY": f"7F000001{opaque:016X}{i:08X}"})
                for i in range(size)]
    return _encoded(RemotingCommand(int(RequestCode.SEND_BATCH_MESSAGE), opaque=opaque, fields=header.to_fields(),
                                    body=encode_batch_body(messages)), credentials)


@contextmanager
def profiled(enabled: bool) -> Iterator[None]:
    profile = cProfile.Profile() if enabled else None
    if profile is not None:
        profile.enable()
    try:
        yield
    finally:
        if profile is not None:
            profile.disable()
            pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(30)


class InProcess:
    """A started broker and `connect`ed in-process connections to it."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.trace_write_s = 0.0        # the trace's write CPU already reported
        self._next_port = 20_000

    def connect(self) -> tuple[asyncio.Protocol, DroppingTransport]:
        protocol = self.broker.connection_protocol()
        transport = DroppingTransport(self._next_port)
        self._next_port += 1
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        return protocol, transport

    async def durable_topic(self, topic: str, queues: int) -> None:
        """Create `topic` and wait until it is durable (sends answer at once only to a durable topic)."""
        self.broker.topics.ensure(topic, queues)
        await self.broker.topics.wait_durable()

    async def warmed_connection(self, warm_up: Iterable[bytes]) -> tuple[asyncio.Protocol, DroppingTransport]:
        """A `connect`ed connection fed the `warm_up` frames (files mapped, caches filled), settled."""
        protocol, transport = self.connect()
        for i, frame in enumerate(warm_up):
            protocol.data_received(frame)
            if i & 255 == 255:
                await asyncio.sleep(0)          # let the loop run its callbacks (flushes)
        await settle()
        return protocol, transport


async def with_broker(body: Any, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="rocketq-inproc-") as directory:
        auth = AuthConfig(authentication_enabled=True, authorization_enabled=True,
                          max_nonces=16_777_216) if args.auth else AuthConfig()
        # the trace's writes run between the measured reads; `_trace_write_us` reports their CPU
        trace = TraceConfig(enabled=args.trace == "on")
        config = BrokerConfig(listen_port=0, metrics_port=0, grpc_port=0,
                              max_requests_per_step=args.max_requests_per_step,
                              store=StoreConfig(path=Path(directory), flush_disk_type="ASYNC_FLUSH",
                                                 key_index_max_entries=args.key_index_max_entries), auth=auth,
                              trace=trace)
        async with Broker(config) as broker:
            store = broker.auth.store
            if args.auth and store is not None:     # a Normal user allowed Pub on the topic
                store.create_user(User(username=PRODUCER.access_key, signing_key=PRODUCER.key))
                store.put_acl(PRODUCER.access_key, [AclEntry(resource=Resource.parse("Topic:inproc"),
                                                             actions=frozenset({"Pub"}))], create=True)
            await body(InProcess(broker))


def credentials(args: argparse.Namespace) -> Credentials | None:
    return PRODUCER if args.auth else None


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def steps_until(done: Callable[[], bool], what: str, max_steps: int = 100_000) -> None:
    """Let the loop run step by step until `done()`: the broker handles a connection's pipelined
    requests `max_requests_per_step` at a time, so a long feed takes several steps. Raises
    `RuntimeError` naming `what` when `max_steps` were not enough."""
    for _ in range(max_steps):
        if done():
            return
        await asyncio.sleep(0)
    raise RuntimeError(f"{what} after {max_steps} loop steps")


async def feed_one_at_a_time(protocol: asyncio.Protocol, frames: list[bytes], idle_s: float, profile: bool) -> float:
    """Hand `frames` to `protocol` one read each (after `idle_s` of sleep when positive); the
    broker's CPU seconds inside those reads, summed."""
    gc.collect()
    cpu = 0.0
    with profiled(profile):
        for i, frame in enumerate(frames):
            if idle_s:
                time.sleep(idle_s)
            started = time.thread_time()
            operator.call(protocol.data_received, frame)    # (the read `bench.instructions` counts)
            cpu += time.thread_time() - started
            if i & 255 == 255:
                await asyncio.sleep(0)          # let the loop run its callbacks (flushes)
    return cpu
