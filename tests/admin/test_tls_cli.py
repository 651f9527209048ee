"""The admin commands and `rocketq top` over TLS: `--tls` / `--ca-file` before or after the
subcommand, or ROCKETQ_TLS / ROCKETQ_CA_FILE; without them a TLS broker is unreachable (exit 2)."""

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

CLEAN_ENV: dict[str, str | None] = {"ROCKETQ_ENDPOINTS": None, "ROCKETQ_TLS": None, "ROCKETQ_CA_FILE": None}


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
