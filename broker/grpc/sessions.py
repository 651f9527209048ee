"""The gRPC clients the broker knows (`Sessions`), each a `ClientChannel`: what the broker's
registries keep for a client (a producer's channel, which transaction check-backs go to) and its
Telemetry stream's outbound queue.

A client is named by its `x-mq-client-id` metadata. Its Telemetry stream (one at a time; a newer
one replaces the older) carries its `Settings` in and the broker's commands out. The transaction
check service sends CHECK_TRANSACTION_STATE to a producer channel (`invoke_oneway`); here that
becomes a `RecoverOrphanedTransactionCommand` on the stream, as the Java proxy's
`ProxyChannel.processCheckTransaction` does. A client whose stream is gone is `closed` for the
check service, so no check-back is lost on it (the check is retried at the next pass)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from broker.grpc.convert import to_proto
from broker.grpc.proto import service_pb2 as spb
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.headers_v5 import CheckTransactionStateRequestHeader
from protocol.message import decode_message_batch

log = logging.getLogger(__name__)
MAX_QUEUED_COMMANDS = 1_024     # commands waiting for a client's stream; past it they are dropped (logged)


def transaction_id(commit_log_offset: int, half_offset: int) -> str:
    """The gRPC transaction id of a half message: where END_TRANSACTION finds it."""
    return f"{commit_log_offset}:{half_offset}"


def parse_transaction_id(text: str) -> tuple[int, int] | None:
    """(commit_log_offset, half_offset) of a `transaction_id`, None when it is not one."""
    first, sep, second = text.partition(":")
    if not sep or len(text) > 42 or not text.isascii() or not first.isdigit() or not second.isdigit():
        return None
    return int(first), int(second)


@dataclass(eq=False)
class ClientChannel:
    """One gRPC client, in the place of a connection's `Channel` in the broker's registries
    (hashable by identity). `client_type` and `topics` (a producer's, valid names, at most 1,000):
    from the last `Settings` its Telemetry stream sent (0 and () before; the settings themselves are
    not kept: a client chooses their size); `stream`: the outbound queue of its current Telemetry
    stream (None when it has none)."""

    client_id: str
    remote_address: str
    client_type: int = 0
    topics: tuple[str, ...] = ()
    stream: asyncio.Queue[spb.TelemetryCommand | None] | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    _closed: bool = False

    def __repr__(self) -> str:
        return f"<grpc client {self.client_id} {self.remote_address}>"

    @property
    def closed(self) -> bool:
        return self._closed or self.stream is None

    @property
    def write_paused(self) -> bool:
        return self.stream is not None and self.stream.qsize() >= MAX_QUEUED_COMMANDS

    def push(self, command: spb.TelemetryCommand) -> bool:
        """Queue `command` on the client's stream; False when it has none or it is full."""
        stream = self.stream
        if stream is None or stream.qsize() >= MAX_QUEUED_COMMANDS:
            return False
        stream.put_nowait(command)
        return True

    def invoke_oneway(self, command: RemotingCommand) -> None:
        """The broker's one-way requests to a client: CHECK_TRANSACTION_STATE is sent on the stream
        as a `RecoverOrphanedTransactionCommand`; anything else is not for a gRPC client (dropped)."""
        if command.code != RequestCode.CHECK_TRANSACTION_STATE:
            log.debug("%r: request code %d has no gRPC form; not sent", self, command.code)
            return
        header = CheckTransactionStateRequestHeader.from_fields(command.fields)
        messages = decode_message_batch(command.body_bytes())
        if not messages:
            return
        message = messages[0]
        msg_id = header.transaction_id or header.msg_id or ""
        recover = spb.RecoverOrphanedTransactionCommand(
            message=to_proto(message, msg_id=msg_id, topic=header.topic),
            transaction_id=transaction_id(header.commit_log_offset, header.tran_state_table_offset))
        if not self.push(spb.TelemetryCommand(recover_orphaned_transaction_command=recover)):
            log.info("%r: transaction check of %s not sent (no stream, or its queue is full)", self, msg_id)

    def end_stream(self, stream: asyncio.Queue[spb.TelemetryCommand | None]) -> None:
        """The Telemetry stream owning `stream` ended (a newer one may have replaced it)."""
        if self.stream is stream:
            self.stream = None

    def close(self) -> None:
        """Expired or terminated: its stream ends and the registries forget it."""
        self._closed = True
        if self.stream is not None:
            self.stream.put_nowait(None)
            self.stream = None


class Sessions:
    """client id → `ClientChannel`, at most `max_clients` (the oldest-made is closed past it)."""

    def __init__(self, max_clients: int = 10_000) -> None:
        self._clients: dict[str, ClientChannel] = {}
        self._max_clients = max_clients

    def __len__(self) -> int:
        return len(self._clients)

    def get(self, client_id: str) -> ClientChannel | None:
        return self._clients.get(client_id)

    def channel(self, client_id: str, remote_address: str) -> tuple[ClientChannel, ClientChannel | None]:
        """The channel of `client_id` (made on first use; a closed one is replaced), and the one
        evicted to make room (None usually): the caller unregisters that one."""
        channel = self._clients.get(client_id)
        if channel is not None and not channel._closed:
            return channel, None
        evicted = None
        if channel is None and len(self._clients) >= self._max_clients:
            evicted = self._clients.pop(next(iter(self._clients)))
            evicted.close()
        channel = self._clients[client_id] = ClientChannel(client_id, remote_address)
        return channel, evicted

    def remove(self, client_id: str) -> ClientChannel | None:
        channel = self._clients.pop(client_id, None)
        if channel is not None:
            channel.close()
        return channel

    def close_all(self) -> None:
        for channel in self._clients.values():
            channel.close()
        self._clients.clear()
