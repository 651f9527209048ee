"""`HAServer`: a master's side of replication (RocketMQ `DefaultHAService` + `HAConnection`).

Listens on `ha_listen_port` (TLS with `[tls]`). Per slave connection: read its hello (a signed
frame when auth is on), check it (same broker_name, an offset the master has), then two loops:
- the writer sends whole records from the slave's offset, never more than `window_bytes` past what
  the slave acknowledged (memory on both sides stays bounded, and a slave that stops reading only
  stops the writer: `drain` waits), a heartbeat when idle and the metadata snapshot periodically,
  and ahead of any record appended after a topic or group changed (`metadata_version` moved): a
  send that auto-created its topic reaches the slave after that topic's config, so a slave that
  acknowledged it knows the topic when it takes over (RocketMQ's slave syncs topic configs only
  every 10 s, and a topic created just before a failover is unknown to the new master until then);
- the reader takes the slave's acks (`>Q`), hands them to the `SyncGate` and opens the window.
A connection silent for `housekeeping_timeout_ms`, an ack past what was sent, or anything else off
protocol closes it; the slave reconnects and resumes from its own end."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from auth.enforcer import Enforcer, Peer
from broker.ha.epochs import consistent_offset
from broker.ha.streams import Watchdog, read_first_frame
from broker.ha.sync_gate import SyncGate
from broker.ha.wire import (
    ACK,
    KIND_DATA,
    KIND_HEARTBEAT,
    KIND_METADATA,
    HAProtocolError,
    hello_answer,
    hello_refusal,
    parse_hello,
    transfer_header,
    truncate_answer,
)
from broker.store.message_store import MessageStore
from protocol.codes import ResponseCode
from protocol.errors import FrameError, NoPermission
from protocol.frame import encode_frame

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HAServerConfig:
    broker_name: str
    window_bytes: int
    heartbeat_interval_ms: int
    housekeeping_timeout_ms: int
    metadata_interval_ms: int


class HAServer:
    """`port` once started. `metadata()` returns the snapshot slaves copy (msgpack bytes);
    `metadata_version()` a number that moves whenever a table that must precede the records
    (topics, groups) changed (default: never, only the periodic snapshot)."""

    def __init__(self, host: str, port: int, store: MessageStore, gate: SyncGate, config: HAServerConfig, *,
                 enforcer: Callable[[], Enforcer | None], metadata: Callable[[], bytes],
                 tls: ssl.SSLContext | None = None, epochs: Callable[[], list[tuple[int, int]]] | None = None,
                 metadata_version: Callable[[], int] = lambda: 0) -> None:
        """`epochs` (controller mode): this master's epoch entries; a slave whose hello carries
        its own is told where to truncate when its log diverged (`epochs.consistent_offset`)."""
        self._host, self._requested_port, self._store, self.gate, self._config = host, port, store, gate, config
        self._epochs = epochs
        self._enforcer, self._metadata, self._tls = enforcer, metadata, tls
        self._metadata_version = metadata_version
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._arrived: set[asyncio.Event] = set()
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._streams: dict[int, _Stream] = {}
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._host, self._requested_port, ssl=self._tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self._store.on_appended = self.wake

    def wake(self) -> None:
        """New commit-log bytes: wake every connection's writer (the store calls this per append)."""
        for event in self._arrived:
            event.set()

    @property
    def connections(self) -> int:
        return len(self._tasks)

    @property
    def unsent_bytes(self) -> int:
        """Bytes queued in this server's sockets, unsent (bounded by the window per slave, plus a
        heartbeat and a metadata snapshot)."""
        return sum(writer.transport.get_write_buffer_size() for writer in self._writers.values())

    @property
    def unacked_bytes(self) -> int:
        """Commit-log bytes sent to slaves and not acknowledged yet (at most `window_bytes` each,
        or one record when a single record is larger)."""
        return sum(stream.sent - stream.acked for stream in self._streams.values())

    def in_sync_slaves(self) -> set[int]:
        """broker_ids of the connected slaves within `ha_max_gap_bytes` (`SyncGate.in_sync`)."""
        ids = self.gate.slave_ids
        return {ids[c] for c in self.gate.in_sync_connections() if c in ids}

    def close_connections(self) -> None:
        """Cut every slave's connection now (tests, and an operator's "resync"): slaves reconnect
        and resume from their own end."""
        for writer in self._writers.values():
            writer.transport.abort()

    async def stop(self) -> None:
        self._store.on_appended = None
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.gate.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        connection_id = next(self._ids)
        self._writers[connection_id] = writer
        try:
            await self._serve(connection_id, address, reader, writer)
        except (HAProtocolError, FrameError) as exc:
            log.warning("replication connection from %s closed: %s", address, exc)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.info("replication connection from %s ended: %s", address, exc or type(exc).__name__)
        finally:
            self.gate.disconnected(connection_id)
            self._tasks.discard(task)
            self._writers.pop(connection_id, None)
            self._streams.pop(connection_id, None)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)


    async def _serve(self, connection_id: int, address: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        request = await read_first_frame(reader, self._config.housekeeping_timeout_ms)
        hello = parse_hello(request)
        store = self._store
        refusal = None
        enforcer = self._enforcer()
        try:
            if enforcer is not None:
                enforcer.check(request, Peer(address))
        except NoPermission as exc:
            refusal = (ResponseCode.NO_PERMISSION, str(exc.remark if hasattr(exc, "remark") else exc))
        end = store.commit_log_max_offset()
        if refusal is None and hello.broker_name != self._config.broker_name:
            refusal = (ResponseCode.NO_PERMISSION, f"this master replicates {self._config.broker_name!r}, "
                                                   f"not {hello.broker_name!r}")
        epochs = self._epochs() if self._epochs is not None else None
        common = consistent_offset(epochs, end, hello.epochs, hello.max_offset) if epochs and hello.epochs else None
        if refusal is None and common is not None and hello.max_offset > common:
            writer.writelines(encode_frame(truncate_answer(request, common)))
            await writer.drain()
            raise HAProtocolError(f"slave {hello.broker_name}/{hello.broker_id} diverged after {common} "
                                  f"(its end {hello.max_offset}): told to truncate")
        if refusal is None and hello.max_offset > end:
            refusal = (ResponseCode.SYSTEM_ERROR, f"slave is ahead of the master ({hello.max_offset} > {end}): "
                                                  f"its log diverged; it must be truncated before it can follow")
        if refusal is not None:
            writer.writelines(encode_frame(hello_refusal(request, refusal[0], refusal[1])))
            await writer.drain()
            raise HAProtocolError(f"refused slave {hello.broker_name}/{hello.broker_id}: {refusal[1]}")
        start = max(hello.max_offset, store.commit_log_min_offset())
        writer.writelines(encode_frame(hello_answer(request, master_max_offset=end, start_offset=start,
                                                    epochs=epochs)))
        await writer.drain()
        log.info("slave %s/%d connected from %s; streaming from commit-log offset %d (master at %d)",
                 hello.broker_name, hello.broker_id, address, start, end)
        stream = self._streams[connection_id] = _Stream(start)
        self.gate.slave_ids[connection_id] = hello.broker_id
        self.gate.acknowledged(connection_id, hello.max_offset)
        arrived = asyncio.Event()
        self._arrived.add(arrived)
        watchdog = Watchdog(writer.transport, self._config.housekeeping_timeout_ms)

        def acknowledged(acked: int) -> None:
            if acked > stream.sent:
                raise HAProtocolError(f"ack {acked} is past what was sent ({stream.sent})")
            stream.acked = max(stream.acked, acked)
            self.gate.acknowledged(connection_id, stream.acked)
            arrived.set()              # the window may have opened

        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        acks = _AckReader(writer.transport, acknowledged, ended, watchdog)
        sender = asyncio.create_task(self._send(stream, writer, arrived), name=f"ha-send-{connection_id}")
        try:
            acks.take_over(reader)
            done, _ = await asyncio.wait((sender, ended), return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()           # raises what ended the connection
        finally:
            watchdog.cancel()
            self._arrived.discard(arrived)
            ended.cancel()              # (done: its exception was raised above; else nobody reads it)
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    async def _send(self, stream: _Stream, writer: asyncio.StreamWriter, arrived: asyncio.Event) -> None:
        config, store = self._config, self._store
        loop = asyncio.get_running_loop()
        next_metadata, last_snapshot, last_heard_of = 0.0, b"", loop.time()   # (data or a heartbeat sent)
        metadata_version, sent_version = self._metadata_version, -1
        heartbeat_s = config.heartbeat_interval_ms / 1000
        # one timer wakes the idle writer for heartbeats and snapshots (a timeout context around
        # every wait scheduled and cancelled a timer per chunk: ~4 % of a master's samples)
        period_s = min(config.heartbeat_interval_ms, config.metadata_interval_ms) / 1000
        ticker: asyncio.TimerHandle | None = None

        def tick() -> None:
            nonlocal ticker
            arrived.set()
            ticker = loop.call_later(period_s, tick)

        ticker = loop.call_later(period_s, tick)
        try:
            while True:
                # the tables when they changed: every interval, and before any record appended after a
                # topic or group change (same loop step as the chunk read below: no record overtakes it)
                if loop.time() >= next_metadata or metadata_version() != sent_version:
                    sent_version = metadata_version()
                    snapshot = self._metadata()
                    if snapshot != last_snapshot:
                        writer.write(transfer_header(KIND_METADATA, stream.sent, len(snapshot)) + snapshot)
                        last_snapshot = snapshot
                    next_metadata = loop.time() + config.metadata_interval_ms / 1000
                arrived.clear()                       # before looking: an append or ack after this wakes the wait
                room = config.window_bytes - (stream.sent - stream.acked)
                chunk = store.replication_chunk(stream.sent, room) if room > 0 else None
                # a record larger than the room left waits for the acks (alone, it may exceed the window)
                if chunk is not None and (len(chunk[1]) <= room or stream.sent == stream.acked):
                    offset, data = chunk
                    # one write, so one send: the header alone went out as its own segment and woke
                    # the slave for 16 bytes (the copy is ~10 µs for a chunk of thousands of records)
                    writer.write(transfer_header(KIND_DATA, offset, len(data)) + data)
                    stream.sent = offset + len(data)
                    last_heard_of = loop.time()
                    del data, chunk
                    await writer.drain()
                    continue
                if loop.time() >= last_heard_of + heartbeat_s:     # idle that long: a heartbeat
                    writer.write(transfer_header(KIND_HEARTBEAT, store.commit_log_max_offset(), 0))
                    last_heard_of = loop.time()
                    await writer.drain()
                    continue
                await arrived.wait()                  # an append, an ack, or the ticker
        finally:
            if ticker is not None:
                ticker.cancel()


class _Stream:
    """What one connection sent and what its slave acknowledged (commit-log offsets)."""

    __slots__ = ("acked", "sent")

    def __init__(self, start: int) -> None:
        self.sent = self.acked = start


class _AckReader(asyncio.Protocol):
    """A slave's acks (`>Q` commit-log ends, several per read when it got ahead: the last counts),
    read in the transport's own callback: a StreamReader woke a reading task one event-loop step
    later, and every send the ack covers was answered that much later (on a busy master a step is
    1-2 ms). Installed on the transport after the hello; flow control and the connection's loss are
    passed on to the stream's protocol, so the writer's `drain` and `wait_closed` work as before.
    What ends the connection (an ack past what was sent, the peer's close) is set on `ended`."""

    def __init__(self, transport: asyncio.WriteTransport, on_ack: Callable[[int], None],
                 ended: asyncio.Future[None], watchdog: Watchdog) -> None:
        self._transport, self._on_ack, self._ended, self._watchdog = transport, on_ack, ended, watchdog
        self._stream_protocol = transport.get_protocol()
        self._pending = b""

    def take_over(self, reader: asyncio.StreamReader) -> None:
        """Read from now on instead of `reader`; bytes it already buffered are taken first."""
        buffered = bytes(getattr(reader, "_buffer", b""))
        self._transport.set_protocol(self)
        if buffered:
            self.data_received(buffered)

    def data_received(self, data: bytes) -> None:
        self._watchdog.touch()
        pending = self._pending + data if self._pending else data
        whole = len(pending) - len(pending) % ACK.size
        self._pending = pending[whole:]
        if whole and not self._ended.done():
            (acked,) = ACK.unpack_from(pending, whole - ACK.size)
            try:
                self._on_ack(acked)
            except HAProtocolError as exc:
                self._end(exc)
                self._transport.abort()

    def eof_received(self) -> bool:
        self._end(asyncio.IncompleteReadError(self._pending, None))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc if exc is not None else asyncio.IncompleteReadError(self._pending, None))
        self._stream_protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        cast(asyncio.Protocol, self._stream_protocol).pause_writing()

    def resume_writing(self) -> None:
        cast(asyncio.Protocol, self._stream_protocol).resume_writing()

    def _end(self, exc: BaseException) -> None:
        if not self._ended.done():
            self._ended.set_exception(exc)
