"""TLS on the broker's port (issue 37): enforcing refuses plaintext, permissive serves both on one
port, mutual TLS refuses clients without a trusted certificate, and the connection guard bounds
connections still in their handshake. Real brokers in this process, real clients over TCP, fresh
test certificates (conf/devcerts.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import uvloop

from broker.broker import Broker
from broker.process import BrokerSubprocess, cli_command
from client.api import ClientAPI
from conf.tls import TlsConfig, client_context
from protocol.command import RemotingCommand
from protocol.errors import ConnectionClosed
from protocol.frame import FrameDecoder, encode_frame_bytes
from protocol.remoting_client import RemotingClient
from tests.conftest import broker_config
from tests.helpers import send, wait_until
from tests.tls_certs import CertFiles, server_tls


@asynccontextmanager
async def tls_broker(tmp_path: Path, tls: TlsConfig, **overrides: object) -> AsyncIterator[Broker]:
    async with Broker(broker_config(tmp_path, tls=tls, **overrides)) as broker:
        yield broker


@asynccontextmanager
async def api(ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[ClientAPI]:
    remoting = RemotingClient(ssl_context=ssl_context, connect_timeout_ms=2_000)
    try:
        yield ClientAPI(remoting)
    finally:
        await remoting.close()


def heartbeat_frame() -> bytes:
    """A plaintext rocketq request (its first byte is 0: a frame's length is below 16 MiB)."""
    return encode_frame_bytes(RemotingCommand(code=34, opaque=1, remark=""))


async def peer_closes(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bytes:
    """Everything the broker sent before closing the connection (b"" when nothing); fails when it
    stays open `timeout_s`."""
    received = b""
    async with asyncio.timeout(timeout_s):
        try:
            while chunk := await reader.read(65_536):
                received += chunk
        except ConnectionResetError:
            pass
    return received


async def test_enforcing_serves_tls_and_closes_plaintext_connections(tmp_path: Path, tls_certs: CertFiles) -> None:
    async with tls_broker(tmp_path, server_tls(tls_certs, "enforcing")) as broker:
        async with api(client_context(tls_certs.ca_file)) as tls_api:
            result = await send(tls_api, broker.address, "t", b"over tls")
            assert result.queue_offset == 0
        async with api() as plain_api:
            with pytest.raises(ConnectionClosed):
                await send(plain_api, broker.address, "t", b"in clear")
        # What a plaintext client sees: the connection closed, not one byte written to it.
        host, port = broker.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(heartbeat_frame())
        assert await peer_closes(reader) == b""
        writer.close()
        await wait_until(lambda: broker.connection_guard.closed["tls_plaintext"] == 2 and
                         broker.connection_guard.pending == 0, what="plaintext connections closed and counted")
        assert broker.store is not None and broker.store.get_max_offset("t", 0) == 1


async def test_permissive_accepts_tls_and_plaintext_on_the_same_port(tmp_path: Path, tls_certs: CertFiles) -> None:
    async with (tls_broker(tmp_path, server_tls(tls_certs, "permissive")) as broker,
                api(client_context(tls_certs.ca_file)) as tls_api, api() as plain_api):
        for index in range(3):
            assert (await send(tls_api, broker.address, "t", b"tls")).queue_offset == 2 * index
            assert (await send(plain_api, broker.address, "t", b"plain")).queue_offset == 2 * index + 1
        assert len(broker.connection_guard.connections) == 2 and broker.connection_guard.pending == 0


async def test_mutual_tls_refuses_clients_without_a_trusted_certificate(tmp_path: Path,
                                                                        tls_certs: CertFiles) -> None:
    certs = tls_certs
    async with tls_broker(tmp_path, server_tls(certs, "enforcing", require_client_cert=True)) as broker:
        with_cert = client_context(certs.ca_file, certs.client_cert, certs.client_key)
        async with api(with_cert) as trusted:
            assert (await send(trusted, broker.address, "t", b"mtls")).queue_offset == 0
        for refused in (client_context(certs.ca_file),                                     # no certificate
                        client_context(certs.ca_file, certs.rogue_cert, certs.rogue_key)):   # untrusted CA
            # (TLS 1.3: the client's handshake may complete before the broker rejects its
            # certificate, so the refusal can arrive as the close of the first request)
            async with api(refused) as untrusted:
                with pytest.raises(ConnectionClosed):
                    await send(untrusted, broker.address, "t", b"refused")
        await wait_until(lambda: broker.connection_guard.closed["tls_handshake"] == 2, what="two failed handshakes")
        assert broker.store is not None and broker.store.get_max_offset("t", 0) == 1


async def test_a_client_refuses_a_broker_its_cas_do_not_vouch_for(tmp_path: Path, tls_certs: CertFiles) -> None:
    async with tls_broker(tmp_path, server_tls(tls_certs)) as broker:
        async with api(client_context()) as system_cas:      # the test CA is not a system CA
            with pytest.raises(ConnectionClosed, match="certificate verify failed"):
                await send(system_cas, broker.address, "t", b"x")
        localhost = broker.address.replace("127.0.0.1", "localhost")      # the DNS name is in the certificate too
        async with api(client_context(tls_certs.ca_file)) as by_name:
            assert (await send(by_name, localhost, "t", b"x")).queue_offset == 0


@pytest.mark.parametrize("sent", [b"", b"\x16\x03\x01"], ids=["silent", "stalled-handshake"])
async def test_a_connection_without_a_handshake_is_closed_after_the_handshake_timeout(
        tmp_path: Path, tls_certs: CertFiles, sent: bytes) -> None:
    tls = server_tls(tls_certs, "permissive", handshake_timeout_ms=300)
    async with tls_broker(tmp_path, tls) as broker:
        host, port = broker.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(sent)
        await wait_until(lambda: broker.connection_guard.pending == 1, what="the connection counted as pending")
        assert await peer_closes(reader, timeout_s=5) == b""
        writer.close()
        guard = broker.connection_guard
        await wait_until(lambda: guard.pending == 0 and guard.closed["tls_handshake"] == 1 and not guard.per_address,
                         what="the pending connection released")


async def test_connections_in_their_handshake_count_against_max_connections(tmp_path: Path,
                                                                            tls_certs: CertFiles) -> None:
    async with tls_broker(tmp_path, server_tls(tls_certs), max_connections=2) as broker:
        host, port = broker.address.rsplit(":", 1)
        silent = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
        await wait_until(lambda: broker.connection_guard.pending == 2, what="two pending connections")
        async with api(client_context(tls_certs.ca_file)) as tls_api:
            with pytest.raises(ConnectionClosed):
                await send(tls_api, broker.address, "t", b"x")
            assert broker.connection_guard.closed["refused"] >= 1
            for _, writer in silent:
                writer.close()
            await wait_until(lambda: broker.connection_guard.pending == 0, what="pending connections released")
            assert (await send(tls_api, broker.address, "t", b"x")).queue_offset == 0


async def test_the_frame_read_timeout_applies_to_tls_connections(tmp_path: Path, tls_certs: CertFiles) -> None:
    async with tls_broker(tmp_path, server_tls(tls_certs), frame_read_timeout_ms=300) as broker:
        host, port = broker.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), ssl=client_context(tls_certs.ca_file))
        writer.write(heartbeat_frame()[:6])      # a frame's first bytes, never the rest
        await writer.drain()
        await peer_closes(reader)
        writer.close()
        assert broker.connection_guard.closed["frame_timeout"] == 1


class HandDrivenTls:
    """A TLS client over a raw connection, driven by hand so a test controls what each write holds."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> None:
        self.reader, self.writer = reader, writer
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")

    async def handshake_in_pieces(self, first_piece_read: Callable[[], bool], request: bytes) -> None:
        """The ClientHello's first byte goes alone (the rest only once `first_piece_read()`), and
        `request` leaves in the same write as the client's last handshake message."""
        with pytest.raises(ssl.SSLWantReadError):
            self.tls.do_handshake()
        hello = self.outgoing.read()
        self.writer.write(hello[:1])
        await wait_until(first_piece_read, what="the broker read the first byte")
        self.writer.write(hello[1:])
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if self.outgoing.pending:
                    self.writer.write(self.outgoing.read())
                await self._receive()
        self.tls.write(request)
        self.writer.write(self.outgoing.read())        # the last handshake bytes and the request together

    async def _receive(self) -> None:
        data = await self.reader.read(65_536)
        assert data, "the broker closed the connection"
        self.incoming.write(data)

    async def response(self) -> RemotingCommand:
        decoder = FrameDecoder()
        while True:
            try:
                commands = decoder.feed(self.tls.read(65_536))
            except ssl.SSLWantReadError:
                await self._receive()
                continue
            if commands:
                return commands[0]


async def test_a_client_hello_split_across_reads_and_a_request_inside_the_handshake_flight(
        tmp_path: Path, tls_certs: CertFiles) -> None:
    async with tls_broker(tmp_path, server_tls(tls_certs, "permissive")) as broker:
        server = broker._server
        assert server is not None and server._tls is not None
        acceptor = server._tls
        host, port = broker.address.rsplit(":", 1)
        client = HandDrivenTls(*await asyncio.open_connection(host, int(port)), client_context(tls_certs.ca_file))
        async with asyncio.timeout(5):
            await client.handshake_in_pieces(lambda: bool(acceptor._handshakes), heartbeat_frame())
            response = await client.response()
        assert response.opaque == 1 and response.is_response
        assert len(broker.connection_guard.connections) == 1
        client.writer.close()


def test_tls_under_uvloop(tmp_path: Path, tls_certs: CertFiles) -> None:
    async def main() -> None:
        async with tls_broker(tmp_path, server_tls(tls_certs, "permissive", require_client_cert=True)) as broker:
            ctx = client_context(tls_certs.ca_file, tls_certs.client_cert, tls_certs.client_key)
            async with api(ctx) as tls_api, api() as plain_api:
                for index in range(20):
                    body = bytes([index]) * (index * 10_000)
                    assert (await send(tls_api, broker.address, "t", body)).queue_offset == 2 * index
                    assert (await send(plain_api, broker.address, "t", body)).queue_offset == 2 * index + 1
            async with api(client_context(tls_certs.ca_file)) as no_cert:
                with pytest.raises(ConnectionClosed):
                    await send(no_cert, broker.address, "t", b"x")

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def test_a_broker_process_configured_from_its_toml_file(tmp_path: Path, tls_certs: CertFiles) -> None:
    """`rocketq broker start --config broker.toml` with a [tls] table, one key overridden by --set."""
    config = tmp_path / "broker.toml"
    config.write_text(f'[tls]\nmode = "permissive"\ncert_file = "{tls_certs.server_cert}"\n'
                      f'key_file = "{tls_certs.server_key}"\nca_file = "{tls_certs.ca_file}"\n')
    command = [*cli_command(), "--config", str(config)]
    async with BrokerSubprocess(tmp_path / "store", command=command, settings={"tls.mode": "enforcing"}) as process:
        async with api(client_context(tls_certs.ca_file)) as tls_api:
            assert (await send(tls_api, process.address, "t", b"x")).queue_offset == 0
        async with api() as plain_api:
            with pytest.raises(ConnectionClosed):
                await send(plain_api, process.address, "t", b"in clear")


async def test_a_broker_process_with_an_unreadable_certificate_says_so_in_one_line(tmp_path: Path,
                                                                                   tls_certs: CertFiles) -> None:
    missing = tmp_path / "missing.pem"
    process = BrokerSubprocess(tmp_path / "store", settings={
        "tls.mode": "enforcing", "tls.cert_file": str(missing), "tls.key_file": tls_certs.server_key})
    with pytest.raises(RuntimeError, match="broker exited before listening") as failed:
        await process.start()
    assert f"cannot load the certificate '{missing}'" in str(failed.value)


async def _churn(broker: Broker, ca_file: str) -> None:
    """Connections that end at every stage: before a byte, after the first byte, in the handshake,
    right after it (the close in the same write as the client's last handshake bytes), after a
    request. The guard must be back to no connection, nothing pending, no address counted."""
    host, port = broker.address.rsplit(":", 1)
    context = client_context(ca_file)
    for stage in range(5):
        for _ in range(4):
            reader, writer = await asyncio.open_connection(host, int(port))
            client = HandDrivenTls(reader, writer, context)
            if stage == 1:
                writer.write(b"\x16")
            elif stage == 2:
                with pytest.raises(ssl.SSLWantReadError):
                    client.tls.do_handshake()
                writer.write(client.outgoing.read())
            elif stage >= 3:
                await client.handshake_in_pieces(lambda: True, heartbeat_frame() if stage == 4 else b"")
                if stage == 4:
                    await client.response()
            writer.close()
    guard = broker.connection_guard
    await wait_until(lambda: not guard.connections and guard.pending == 0 and not guard.per_address,
                     what="every connection released")


async def test_connections_ending_at_any_stage_leave_nothing_counted(tmp_path: Path, tls_certs: CertFiles) -> None:
    async with tls_broker(tmp_path, server_tls(tls_certs, "permissive")) as broker:
        await _churn(broker, tls_certs.ca_file)


def test_connections_ending_at_any_stage_leave_nothing_counted_under_uvloop(tmp_path: Path,
                                                                           tls_certs: CertFiles) -> None:
    async def main() -> None:
        async with tls_broker(tmp_path, server_tls(tls_certs, "permissive")) as broker:
            await _churn(broker, tls_certs.ca_file)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
