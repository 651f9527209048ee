"""The admin commands and `rocketq top` over TLS: `--tls` / `--ca-file` before or after the
subcommand, or ROCKETQ_TLS / ROCKETQ_CA_FILE; without them a TLS broker is unreachable (exit 2).
Against a broker requiring client certificates (mutual TLS): `--cert-file` / `--key-file` or
ROCKETQ_CERT_FILE / ROCKETQ_KEY_FILE; without one, or with one of an untrusted CA, it is unreachable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from conf.tls import client_context
from protocol.remoting_client import RemotingClient
from tests.admin.cli_runner import rocketq
from tests.conftest import broker_config
from tests.helpers import send
from tests.tls_certs import CertFiles, server_tls

CLEAN_ENV: dict[str, str | None] = {"ROCKETQ_ENDPOINTS": None, "ROCKETQ_TLS": None, "ROCKETQ_CA_FILE": None,
                                    "ROCKETQ_CERT_FILE": None, "ROCKETQ_KEY_FILE": None}


@pytest.fixture
async def tls_broker(tmp_path: Path, tls_certs: CertFiles) -> AsyncIterator[Broker]:
    async with Broker(broker_config(tmp_path, tls=server_tls(tls_certs, "enforcing"))) as broker:
        remoting = RemotingClient(ssl_context=client_context(tls_certs.ca_file))
        try:
            await send(ClientAPI(remoting), broker.address, "tls-seen", b"x")
        finally:
            await remoting.close()
        yield broker


async def test_admin_commands_take_tls_and_a_ca_file(tls_broker: Broker, tls_certs: CertFiles) -> None:
    address, ca = tls_broker.address, tls_certs.ca_file
    for args in (["admin", "topic", "list", "-n", address, "--tls", "--ca-file", ca],
                 ["admin", "--tls", "--ca-file", ca, "-n", address, "topic", "list"],
                 ["admin", "--ca-file", ca, "topicList", "-n", address]):     # a CA file implies --tls
        result = await rocketq(*args, env=CLEAN_ENV)
        assert result.exit_code == 0 and "tls-seen" in result.output, (args, result.output)
    from_env = await rocketq("admin", "topic", "list", env={**CLEAN_ENV, "ROCKETQ_ENDPOINTS": address,
                                                             "ROCKETQ_TLS": "1", "ROCKETQ_CA_FILE": ca})
    assert from_env.exit_code == 0 and "tls-seen" in from_env.output, from_env.output
    plaintext = await rocketq("admin", "topic", "list", "-n", address, env=CLEAN_ENV)
    assert plaintext.exit_code == 2 and f"cannot reach the broker at {address}" in plaintext.stderr
    untrusted = await rocketq("admin", "topic", "list", "-n", address, "--tls", env=CLEAN_ENV)   # system CAs
    assert untrusted.exit_code == 2 and "certificate verify failed" in untrusted.stderr


async def test_top_takes_tls_and_a_ca_file(tls_broker: Broker, tls_certs: CertFiles) -> None:
    result = await rocketq("top", "--iterations", "1", "-n", tls_broker.address, "--tls", "--ca-file",
                           tls_certs.ca_file, env=CLEAN_ENV)
    assert result.exit_code == 0, result.output
    refused = await rocketq("top", "--iterations", "1", "-n", tls_broker.address, env=CLEAN_ENV)
    assert refused.exit_code == 2, refused.output


async def test_filter_test_takes_tls(tls_broker: Broker, tls_certs: CertFiles) -> None:
    result = await rocketq("admin", "filter", "test", "--topic", "tls-seen", "--expression", "a > 1",
                           "-n", tls_broker.address, "--ca-file", tls_certs.ca_file, env=CLEAN_ENV)
    assert result.exit_code == 0, result.output


@pytest.fixture
async def mutual_tls_broker(tmp_path: Path, tls_certs: CertFiles) -> AsyncIterator[Broker]:
    """A broker enforcing TLS and requiring a client certificate, with topic `mtls-seen`."""
    tls = server_tls(tls_certs, "enforcing", require_client_cert=True)
    async with Broker(broker_config(tmp_path, tls=tls)) as broker:
        context = client_context(tls_certs.ca_file, tls_certs.client_cert, tls_certs.client_key)
        remoting = RemotingClient(ssl_context=context)
        try:
            await send(ClientAPI(remoting), broker.address, "mtls-seen", b"x")
        finally:
            await remoting.close()
        yield broker


async def test_admin_presents_a_client_certificate(mutual_tls_broker: Broker, tls_certs: CertFiles) -> None:
    address, ca = mutual_tls_broker.address, tls_certs.ca_file
    cert = ["--cert-file", tls_certs.client_cert, "--key-file", tls_certs.client_key]
    for args in (["admin", "topic", "list", "-n", address, "--ca-file", ca, *cert],
                 ["admin", "--ca-file", ca, *cert, "topic", "list", "-n", address]):    # before the subcommand
        result = await rocketq(*args, env=CLEAN_ENV)
        assert result.exit_code == 0 and "mtls-seen" in result.output, (args, result.output)
    from_env = await rocketq("admin", "topic", "list", "-n", address, env={
        **CLEAN_ENV, "ROCKETQ_CA_FILE": ca, "ROCKETQ_CERT_FILE": tls_certs.client_cert,
        "ROCKETQ_KEY_FILE": tls_certs.client_key})
    assert from_env.exit_code == 0 and "mtls-seen" in from_env.output, from_env.output
    no_cert = await rocketq("admin", "topic", "list", "-n", address, "--ca-file", ca, env=CLEAN_ENV)
    assert no_cert.exit_code == 2 and f"cannot reach the broker at {address}" in no_cert.stderr, no_cert.output
    rogue = await rocketq("admin", "topic", "list", "-n", address, "--ca-file", ca, "--cert-file",
                          tls_certs.rogue_cert, "--key-file", tls_certs.rogue_key, env=CLEAN_ENV)
    assert rogue.exit_code == 2, rogue.output
    key_alone = await rocketq("admin", "topic", "list", "-n", address, "--ca-file", ca, "--key-file",
                              tls_certs.client_key, env=CLEAN_ENV)
    assert key_alone.exit_code == 2 and "--key-file needs --cert-file" in key_alone.stderr, key_alone.output


async def test_top_presents_a_client_certificate(mutual_tls_broker: Broker, tls_certs: CertFiles) -> None:
    address = mutual_tls_broker.address
    result = await rocketq("top", "--iterations", "1", "-n", address, "--ca-file", tls_certs.ca_file,
                           "--cert-file", tls_certs.client_cert, "--key-file", tls_certs.client_key, env=CLEAN_ENV)
    assert result.exit_code == 0, result.output
    from_env = await rocketq("top", "--iterations", "1", "-n", address, env={
        **CLEAN_ENV, "ROCKETQ_CA_FILE": tls_certs.ca_file, "ROCKETQ_CERT_FILE": tls_certs.client_cert,
        "ROCKETQ_KEY_FILE": tls_certs.client_key})
    assert from_env.exit_code == 0, from_env.output
    refused = await rocketq("top", "--iterations", "1", "-n", address, "--ca-file", tls_certs.ca_file, env=CLEAN_ENV)
    assert refused.exit_code == 2, refused.output
