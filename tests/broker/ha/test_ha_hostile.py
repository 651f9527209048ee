"""What a replication peer must not be able to do to a master: garbage, a hello naming an offset the
master never had, a stream it never reads, acks for bytes never sent, an unsigned hello when
authentication is on. And what the stream survives: a cut connection, TLS."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

from broker.broker import Broker
from broker.ha.streams import read_first_frame
from broker.ha.wire import ACK, TRANSFER_HEADER, Hello, hello_command
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.tls import TlsConfig, client_context
from protocol.codes import ResponseCode
from protocol.frame import encode_frame_bytes
from protocol.signing import sign
from tests.conftest import broker_config
from tests.helpers import send, wait_until
from tests.security_helpers import ADMIN, secured_config
from tests.tls_certs import CertFiles, server_tls


def ha_port(broker: Broker) -> int:
    assert broker.replication is not None
    return broker.replication.ha_address_port


async def hello(port: int, max_offset: int = 0, *, name: str = "broker-a",
                signed: bool = False) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    """Connect, say hello, return the streams and the answer's code (the answer frame is read)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    command = hello_command(Hello(name, 1, max_offset))
    if signed:
        sign(command, ADMIN)
    writer.write(encode_frame_bytes(command))
    answer = await read_first_frame(reader, 5_000)
    return reader, writer, answer.code


async def closed_by_peer(reader: asyncio.StreamReader) -> None:
    async with asyncio.timeout(5):
        try:
            while await reader.read(65_536):
                pass
        except ConnectionResetError:
            pass


async def test_garbage_and_bad_hellos_are_refused(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path)) as master:
        await send(client_api, master.address, "t", b"x")
        port = ha_port(master)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(os.urandom(4) + b"\xff" * 100)        # a frame length over the hello bound
        await closed_by_peer(reader)
        writer.close()
        for kwargs in ({"max_offset": 1 << 62}, {"name": "broker-b"}):
            reader, writer, code = await hello(port, **kwargs)
            assert code != ResponseCode.SUCCESS
            await closed_by_peer(reader)
            writer.close()
        reader, writer, code = await hello(port)
        assert code == ResponseCode.SUCCESS
        writer.write(ACK.pack(1 << 40))                     # an ack for bytes never sent
        await closed_by_peer(reader)
        writer.close()
        await send(client_api, master.address, "t", b"still serving")
        assert master.replication is not None and master.replication.server is not None
        server = master.replication.server
        await wait_until(lambda: server.connections == 0, what="connections closed")


async def test_a_slave_that_never_reads_holds_a_bounded_window_then_is_dropped(
        tmp_path: Path, client_api: ClientAPI) -> None:
    window = 64 * 1024
    async with Broker(broker_config(tmp_path, ha_window_bytes=window, ha_housekeeping_timeout_ms=1_000,
                                    ha_heartbeat_interval_ms=50)) as master:
        body = b"b" * 8_000
        for i in range(300):                                # 2.4 MB: far more than the window
            await send(client_api, master.address, "t", body, queue_id=i % 4)
        assert master.replication is not None and master.replication.server is not None
        server = master.replication.server
        _reader, writer, code = await hello(ha_port(master))
        assert code == ResponseCode.SUCCESS
        await wait_until(lambda: server.unacked_bytes > window // 2, what="master streaming")
        for _ in range(20):     # it stays stalled at one window past the (absent) acks
            assert window // 2 < server.unacked_bytes <= window
            assert server.unsent_bytes <= window + 16 * 1024
            await asyncio.sleep(0.02)
        await wait_until(lambda: server.connections == 0, timeout_s=5, what="silent slave dropped")
        writer.close()


async def test_hello_must_be_signed_when_authentication_is_on(tmp_path: Path) -> None:
    async with Broker(secured_config(tmp_path, lenient=True)) as master:
        _, writer, code = await hello(ha_port(master))
        assert code == ResponseCode.NO_PERMISSION
        writer.close()
        _reader, writer, code = await hello(ha_port(master), signed=True)
        assert code == ResponseCode.SUCCESS
        writer.close()


async def test_slave_with_inner_credentials_replicates_from_a_secured_master(tmp_path: Path) -> None:
    async with Broker(secured_config(tmp_path / "m", lenient=True)) as master:
        auth = replace(master.config.auth, inner_credentials=f"{ADMIN.access_key}:{ADMIN.secret_key}")
        async with Broker(secured_config(tmp_path / "s", broker_role="SLAVE", broker_id=1, auth=auth,
                                         ha_master_address=f"127.0.0.1:{ha_port(master)}")) as slave:
            assert slave.replication is not None and slave.replication.client is not None
            client = slave.replication.client
            await wait_until(lambda: client.connected, what="secured slave connected")


async def test_replication_over_tls_survives_a_cut_connection(tmp_path: Path, tls_certs: CertFiles) -> None:
    tls: TlsConfig = server_tls(tls_certs)
    remoting = RemotingClient(ssl_context=client_context(tls_certs.ca_file))
    api = ClientAPI(remoting)
    try:
        async with Broker(broker_config(tmp_path / "m", tls=tls)) as master, \
                Broker(broker_config(tmp_path / "s", tls=tls, broker_role="SLAVE", broker_id=1,
                                     ha_master_address=f"127.0.0.1:{ha_port(master)}")) as slave:
            for i in range(20):
                await send(api, master.address, "t", f"a{i}".encode())
            assert master.store is not None and slave.store is not None
            assert master.replication is not None and master.replication.server is not None
            assert slave.replication is not None and slave.replication.client is not None
            m_store, s_store, client = master.store, slave.store, slave.replication.client
            await wait_until(lambda: s_store.commit_log_max_offset() == m_store.commit_log_max_offset(),
                             what="caught up over TLS")
            master.replication.server.close_connections()
            for i in range(20):
                await send(api, master.address, "t", f"b{i}".encode())
            await wait_until(lambda: client.sessions >= 2 and
                             s_store.commit_log_max_offset() == m_store.commit_log_max_offset(),
                             what="resumed after the cut")
    finally:
        await remoting.close()


def test_transfer_header_layout() -> None:
    assert TRANSFER_HEADER.size == 13 and ACK.size == 8
