"""The clients over TLS (issue 37): a producer and a push consumer send and consume through a broker
that enforces mutual TLS, the pull consumer too, `tls=True` with the system's CA bundle, and the
broker's /metrics over HTTPS scraped by urllib. Real brokers in this process, real TCP."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
)
from conf.client import ClientConfig, with_tls
from conf.tls import TlsConfig, client_context
from protocol.errors import ConnectionClosed, NoPermission
from tests.auth.servers import ROOT, secured_broker
from tests.client.test_push_consumer import FAST, consumer
from tests.conftest import broker_config
from tests.helpers import free_port, wait_until
from tests.tls_certs import CertFiles, server_tls


@pytest.fixture
async def mtls_broker(tmp_path: Path, tls_certs: CertFiles) -> AsyncIterator[Broker]:
    tls = server_tls(tls_certs, "enforcing", require_client_cert=True)
    async with Broker(broker_config(tmp_path, tls=tls, metrics_port=free_port())) as broker:
        yield broker


def client_ssl(certs: CertFiles) -> ssl.SSLContext:
    return client_context(certs.ca_file, certs.client_cert, certs.client_key)


async def test_a_producer_and_a_push_consumer_over_mutual_tls(mtls_broker: Broker, tls_certs: CertFiles) -> None:
    address, context = mtls_broker.address, client_ssl(tls_certs)
    async with Producer("pg-tls", address, ssl_context=context) as producer:
        for i in range(20):
            await producer.send(Message("tls-topic", f"m{i}".encode()))
        await producer.send_batch([Message("tls-topic", f"b{i}".encode()) for i in range(30)])
    consumed: list[bytes] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        consumed.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    push = consumer(address, "cg-tls", "tls-topic", listener, config=with_tls(FAST, False, context))
    async with push:
        await wait_until(lambda: len(consumed) >= 50, 10.0, "every message consumed")
    assert sorted(consumed) == sorted([f"m{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(30)])
    async with Producer("pg-no-cert", address, ssl_context=client_context(tls_certs.ca_file),
                        retry_times_when_send_failed=0) as refused:
        with pytest.raises(ConnectionClosed):
            await refused.send(Message("tls-topic", b"refused"))


async def test_a_pull_consumer_over_tls(mtls_broker: Broker, tls_certs: CertFiles) -> None:
    context = client_ssl(tls_certs)
    async with Producer("pg-pull", mtls_broker.address, ssl_context=context) as producer:
        await producer.send_batch([Message("pull-tls", f"{i}".encode()) for i in range(10)],
                                  queue=MessageQueue("pull-tls", mtls_broker.config.broker_name, 0))
    pull = PullConsumer("g-pull-tls", mtls_broker.address, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                        ssl_context=context)
    pull.assign([MessageQueue("pull-tls", mtls_broker.config.broker_name, 0)])
    async with pull:
        got: list[bytes] = []
        async with asyncio.timeout(10):
            while len(got) < 10:
                got += [m.body for m in await pull.poll(1_000)]
    assert got == [f"{i}".encode() for i in range(10)]


async def test_tls_true_verifies_with_the_system_ca_bundle(tmp_path: Path, tls_certs: CertFiles,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", tls_certs.ca_file)      # the "system" bundle: OpenSSL reads it
    async with Broker(broker_config(tmp_path, tls=server_tls(tls_certs, "enforcing"))) as broker:
        async with Producer("pg-system", broker.address, tls=True) as producer:
            assert (await producer.send(Message("t", b"x"))).queue_offset == 0
        assert ClientConfig(tls=True).connection_ssl_context() is not None
        assert ClientConfig().connection_ssl_context() is None


def scrape(url: str, context: ssl.SSLContext | None) -> str:
    with urllib.request.urlopen(url, timeout=5, context=context) as response:
        return str(response.read().decode())


async def test_metrics_are_served_over_https(mtls_broker: Broker, tls_certs: CertFiles) -> None:
    url = f"https://127.0.0.1:{mtls_broker.metrics_port}/metrics"
    text = await asyncio.to_thread(scrape, url, client_ssl(tls_certs))
    assert "rocketmq_messages_in_total" in text or "rocketq_" in text
    # (URLError, or with TLS 1.3 the close after a handshake that looked done to the client)
    with pytest.raises(OSError):       # mutual TLS: no client certificate, no metrics
        await asyncio.to_thread(scrape, url, client_context(tls_certs.ca_file))
    with pytest.raises(OSError):        # plain HTTP is not served
        await asyncio.to_thread(scrape, url.replace("https", "http"), None)


async def test_metrics_over_https_without_client_certificates(tmp_path: Path, tls_certs: CertFiles) -> None:
    tls: TlsConfig = server_tls(tls_certs, "permissive")
    async with Broker(broker_config(tmp_path, tls=tls, metrics_port=free_port())) as broker:
        url = f"https://localhost:{broker.metrics_port}/metrics"
        assert "rocketq_" in await asyncio.to_thread(scrape, url, client_context(tls_certs.ca_file))


async def test_credentials_and_tls_together(tmp_path: Path, tls_certs: CertFiles) -> None:
    """Signed requests (#37's authentication) over mutual TLS: both layers apply, independently."""
    tls = server_tls(tls_certs, "enforcing", require_client_cert=True)
    async with secured_broker(tmp_path, tls=tls) as broker:
        context = client_ssl(tls_certs)
        async with Producer("pg-signed-tls", broker.address, credentials=ROOT, ssl_context=context) as producer:
            assert (await producer.send(Message("signed-tls", b"x"))).queue_offset == 0
        async with Producer("pg-unsigned-tls", broker.address, ssl_context=context,
                            retry_times_when_send_failed=0) as unsigned:
            with pytest.raises(NoPermission):
                await unsigned.send(Message("signed-tls", b"x"))
