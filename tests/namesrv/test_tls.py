"""TLS on the name server (issue 37): a broker registers with a name server that enforces mutual
TLS (presenting its own certificate), clients find routes through it over TLS, a plaintext client
is closed, a permissive one serves both, and /metrics is HTTPS. Real servers in this process."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from pathlib import Path

import pytest

from broker.broker import Broker
from client import Message, Producer
from client.api import ClientAPI
from conf.namesrv import NamesrvConfig
from conf.tls import client_context
from namesrv.namesrv import NameServer
from protocol.errors import ConnectionClosed
from protocol.remoting_client import RemotingClient
from tests.conftest import broker_config
from tests.helpers import free_port, wait_until
from tests.tls_certs import CertFiles, server_tls


async def test_a_broker_registers_with_a_mutual_tls_name_server(tmp_path: Path, tls_certs: CertFiles) -> None:
    certs = tls_certs
    namesrv_config = NamesrvConfig(listen_port=0, tls=server_tls(certs, "enforcing", require_client_cert=True))
    async with NameServer(namesrv_config) as namesrv:
        broker_tls = server_tls(certs, "enforcing")     # its certificate serves as its client certificate
        async with Broker(broker_config(tmp_path, namesrv_addr=namesrv.address, tls=broker_tls,
                                        auto_create_topic=True)) as broker:
            registration = broker.registration
            assert registration is not None
            await wait_until(lambda: registration.registrations >= 1 and bool(namesrv.routes.broker_live_table),
                             what="the broker registered")
            assert broker.address in namesrv.routes.broker_live_table
            context = client_context(certs.ca_file, certs.client_cert, certs.client_key)
            async with Producer("pg-ns-tls", namesrv.address, ssl_context=context) as producer:
                result = await producer.send(Message("ns-tls-topic", b"routed over tls"))
            assert result.broker_name == broker.config.broker_name
        remoting = RemotingClient(ssl_context=client_context(certs.ca_file))      # no client certificate
        try:
            with pytest.raises(ConnectionClosed):
                await ClientAPI(remoting).get_route_info(namesrv.address, "ns-tls-topic")
        finally:
            await remoting.close()


async def test_a_tls_broker_cannot_register_with_a_plaintext_name_server(tmp_path: Path,
                                                                         tls_certs: CertFiles) -> None:
    async with NameServer(NamesrvConfig(listen_port=0)) as namesrv, \
            Broker(broker_config(tmp_path, namesrv_addr=namesrv.address, tls=server_tls(tls_certs))) as broker:
        registration = broker.registration
        assert registration is not None
        await wait_until(lambda: registration.registrations >= 1, what="a registration round")
        assert not namesrv.routes.broker_live_table


async def test_permissive_name_server_serves_tls_and_plaintext(tls_certs: CertFiles) -> None:
    config = NamesrvConfig(listen_port=0, tls=server_tls(tls_certs, "permissive"))
    async with NameServer(config) as namesrv:
        for context in (client_context(tls_certs.ca_file), None):
            remoting = RemotingClient(ssl_context=context)
            try:
                assert await ClientAPI(remoting).get_all_topic_list(namesrv.address) == []
            finally:
                await remoting.close()


async def test_enforcing_name_server_closes_plaintext(tls_certs: CertFiles) -> None:
    async with NameServer(NamesrvConfig(listen_port=0, tls=server_tls(tls_certs, "enforcing"))) as namesrv:
        remoting = RemotingClient()
        try:
            with pytest.raises(ConnectionClosed):
                await ClientAPI(remoting).get_all_topic_list(namesrv.address)
        finally:
            await remoting.close()


def scrape(port: int, context: ssl.SSLContext) -> str:
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5, context=context) as response:
        return str(response.read().decode())


async def test_name_server_metrics_over_https(tls_certs: CertFiles) -> None:
    config = NamesrvConfig(listen_port=0, metrics_port=free_port(), tls=server_tls(tls_certs, "enforcing"))
    async with NameServer(config) as namesrv:
        assert namesrv.metrics_port is not None
        text = await asyncio.to_thread(scrape, namesrv.metrics_port, client_context(tls_certs.ca_file))
        assert "rocketq_namesrv_brokers 0.0" in text
