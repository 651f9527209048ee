"""`HAClient`: a slave's side of replication (RocketMQ `HAClient`).

Connects to the master's HA address (`ha_master_address`, else what the name servers answered the
slave's registration with), says hello with its commit-log end (signed with
`auth.inner_credentials` when set; TLS with `[tls]`), then appends what the master streams at the
same offsets (the store's reput dispatches this broker's own consume queues from disk), fsyncs it
under SYNC_FLUSH, and acknowledges its end after every write and every heartbeat (from the fsync's
completion: `_Acker`). The hello's offset counts as acknowledged, so under SYNC_FLUSH it is sent
only once the log is on disk up to it (a session cut during an fsync must not let the master answer
sends that only the slave's page cache holds). A cut or refused
connection, a silent master (`housekeeping_timeout_ms`) or a protocol error: reconnect after a
capped exponential backoff (100 ms doubling to 5 s), resuming from the slave's own end."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.ha.epochs import EpochFile
from broker.ha.streams import Watchdog, read_first_frame
from broker.ha.wire import (
    ACK,
    KIND_DATA,
    KIND_HEARTBEAT,
    TRANSFER_HEADER,
    HAProtocolError,
    Hello,
    hello_command,
    parse_epochs,
    parse_transfer_header,
)
from broker.store.message_store import MessageStore
from broker.store.results import FlushDiskTimeoutError
from protocol.command import RemotingCommand
from protocol.errors import FrameError
from protocol.frame import encode_frame
from protocol.service import Service

log = logging.getLogger(__name__)
BACKOFF_BASE_MS, BACKOFF_CAP_MS = 100, 5_000
MAX_METADATA_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HAClientConfig:
    broker_name: str
    broker_id: int
    window_bytes: int
    housekeeping_timeout_ms: int
    connect_timeout_ms: int = 3_000


class HAClient(Service):
    """`master_address()`: the master's "host:ha_port" now (None: not known yet). `connected` while
    a stream is up; `master_offset` the master's end as last heard; `sessions` streams opened."""

    name = "ha-client"

    def __init__(self, store: MessageStore, config: HAClientConfig, master_address: Callable[[], str | None], *,
                 sync_flush: bool, apply_metadata: Callable[[bytes], None],
                 sign: Callable[[RemotingCommand], None] | None = None, tls: ssl.SSLContext | None = None,
                 epochs: EpochFile | None = None, truncate: Callable[[int], Awaitable[None]] | None = None) -> None:
        """Controller mode: `epochs` go in the hello and copy the master's as the log reaches
        them; a master answering `truncate_to` has `truncate(offset)` cut this store first."""
        super().__init__()
        self._epochs, self._truncate = epochs, truncate
        self._master_epochs: list[tuple[int, int]] = []
        self._store, self._config, self._master_address = store, config, master_address
        self._sync_flush, self._apply_metadata, self._sign, self._tls = sync_flush, apply_metadata, sign, tls
        self._writer: asyncio.StreamWriter | None = None
        self.connected = False
        self.master_offset = -1
        self.sessions = 0
        self.truncations = 0

    async def run(self) -> None:
        failures = 0
        while not self.stopping:
            address = self._master_address()
            if address is not None:
                streamed = self.sessions
                try:
                    await self._replicate(address)
                except (HAProtocolError, FrameError, ValueError, FlushDiskTimeoutError) as exc:
                    log.warning("replication from %s stopped: %s", address, exc)
                except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    if not self.stopping:
                        log.info("replication from %s cut: %s", address, exc or type(exc).__name__)
                finally:
                    self.connected = False
                    self._close()
                failures = 1 if self.sessions > streamed else failures + 1
            else:
                failures += 1
            delay = min(BACKOFF_BASE_MS << min(failures - 1, 16), BACKOFF_CAP_MS) if failures else 0
            if not await self.wait(delay):
                return

    async def stop(self) -> None:
        self._stopping = True
        self._close()
        await super().stop()

    def _close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    async def _replicate(self, address: str) -> None:
        config, store = self._config, self._store
        if self._sync_flush:
            # the hello's offset counts as acknowledged by the master (a SYNC_MASTER answers the
            # sends it covers): it must be on disk, also after a session cut during an fsync
            await store.wait_flushed(store.commit_log_max_offset())
        host, _, port = address.rpartition(":")
        async with asyncio.timeout(config.connect_timeout_ms / 1000):
            reader, writer = await asyncio.open_connection(host, int(port), ssl=self._tls,
                                                           server_hostname=host if self._tls else None)
        self._writer = writer
        epochs = tuple(self._epochs.entries) if self._epochs is not None else None
        hello = hello_command(Hello(config.broker_name, config.broker_id, store.commit_log_max_offset(), epochs))
        if self._sign is not None:
            self._sign(hello)
        writer.writelines(encode_frame(hello))
        await writer.drain()
        answer = await read_first_frame(reader, self._config.housekeeping_timeout_ms)
        truncate_to = answer.fields.get("truncate_to")
        if answer.code != 0 and type(truncate_to) is int and self._truncate is not None:
            log.warning("master %s: %s", address, answer.remark)
            self._close()
            await self._truncate(truncate_to)
            self.truncations += 1
            return
        if answer.code != 0:
            raise HAProtocolError(f"master refused: {answer.remark or answer.code}")
        self._master_epochs = list(parse_epochs(answer.fields.get("epochs")) or ())
        self._adopt_epochs()
        self.sessions += 1
        self.connected = True
        log.info("replicating from master %s from commit-log offset %d (master at %s)", address,
                 store.commit_log_max_offset(), answer.fields.get("master_max_offset"))
        watchdog = Watchdog(writer.transport, config.housekeeping_timeout_ms)
        acker = _Acker(store, writer, self._sync_flush, self._acknowledged)
        try:
            await self._receive(reader, watchdog, acker)
        except (OSError, asyncio.IncompleteReadError) as exc:
            if acker.error is not None:         # the acker cut the connection: say why
                raise acker.error from exc
            raise
        finally:
            watchdog.cancel()
            acker.closed = True         # a round still out acknowledges nothing on this stream

    async def _receive(self, reader: asyncio.StreamReader, watchdog: Watchdog, acker: _Acker) -> None:
        """Append every transfer as it comes and have it acknowledged (the acker asks for the fsync
        at once, before reput dispatches the bytes, and one fsync covers every transfer that
        arrived while the last one ran: the slave's group commit)."""
        store, max_length = self._store, max(self._config.window_bytes, MAX_METADATA_BYTES)
        while True:
            kind, offset, length = parse_transfer_header(await reader.readexactly(TRANSFER_HEADER.size),
                                                         max_length)
            data = await reader.readexactly(length) if length else b""
            watchdog.touch()
            if acker.error is not None:
                raise acker.error
            if kind == KIND_DATA:
                end = store.append_replicated(offset, data)
                del data
                self.master_offset = max(self.master_offset, end)
                acker.want()
            elif kind == KIND_HEARTBEAT:
                self.master_offset = offset
                acker.want()
            else:
                self._apply_metadata(data)

    def _acknowledged(self) -> None:
        """After each ack: the master's epoch entries this log now reached are this slave's too."""
        if self._master_epochs:
            self._adopt_epochs()

    def _adopt_epochs(self) -> None:
        """Copy the master's epoch entries this log has reached (none pending: stop looking)."""
        end = self._store.commit_log_max_offset()
        if self._epochs is not None and not self._epochs.adopt(self._master_epochs, end):
            self._master_epochs = []


class _Acker:
    """Acknowledges the slave's commit-log end once it is written (and fsynced under SYNC_FLUSH),
    from the fsync round's completion itself: it is the `Settable` the flush service resolves, so
    no task waits to be woken a loop step later to write the ack. One fsync wait at a time; what
    arrives meanwhile is acknowledged by the next (`want` again). A failed or timed-out fsync is
    kept in `error` and cuts the connection (the slave reconnects and resumes from its end)."""

    __slots__ = ("_after", "_again", "_out", "_store", "_sync_flush", "_writer", "closed", "error")

    def __init__(self, store: MessageStore, writer: asyncio.StreamWriter, sync_flush: bool,
                 after: Callable[[], None]) -> None:
        self._store, self._writer, self._sync_flush, self._after = store, writer, sync_flush, after
        self._out = self._again = self.closed = False
        self.error: BaseException | None = None

    def want(self) -> None:
        """The log grew (or a heartbeat asks for the end): acknowledge once it is durable."""
        if self._out:
            self._again = True
            return
        end = self._store.commit_log_max_offset()
        if self._sync_flush:
            self._out = True
            self._store.resolve_when_fsynced(end, self, end)     # may call set_result at once
        else:
            self._ack(end)

    def _ack(self, end: int) -> None:
        if self.closed or self.error is not None:
            return
        self._writer.write(ACK.pack(end))
        self._after()

    # -- Settable, for the flush service -------------------------------------------------------------

    def done(self) -> bool:
        return False

    def set_result(self, end: int, /) -> None:
        self._out = False
        self._ack(end)
        if self._again:
            self._again = False
            self.want()

    def set_exception(self, exc: BaseException, /) -> None:
        self._out = False
        if self.error is None and not self.closed:
            self.error = exc
            self._writer.transport.abort()
