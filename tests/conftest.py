"""Shared fixtures: a real broker in this process on port 0 with a temporary store, and a real
client API talking to it over TCP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.broker import Broker
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.broker import BrokerConfig, LongPollingConfig
from conf.store import StoreConfig
from tests.tls_certs import CertFiles, make_certs

# Short delay levels: level N is N x 100 ms up to 1 s, so retries (level 3 + reconsume_times) and
# delayed messages arrive within a test's patience.
TEST_DELAY_LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms 1s 1s 1s 1s 1s 1s 1s 1s 1s"


def broker_config(tmp_path: Path, **overrides: object) -> BrokerConfig:
    """Defaults for tests: port 0, no metrics endpoint (tests that scrape pass a free
    `metrics_port`), a store under tmp_path with small files, short delay levels."""
    store = StoreConfig(path=tmp_path / "store", commit_log_segment_bytes=1024 * 1024,
                        consume_queue_segment_units=1_000, message_delay_level=TEST_DELAY_LEVELS)
    fields: dict[str, object] = {"listen_port": 0, "metrics_port": 0, "grpc_port": 0, "store": store,
                                 "persist_interval_ms": 200,
                                 "long_polling": LongPollingConfig(check_interval_ms=5_000),
                                 "graceful_shutdown_timeout_ms": 2_000}
    fields.update(overrides)
    return BrokerConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(broker_config(tmp_path)) as running:
        yield running


@pytest.fixture
async def client_api() -> AsyncIterator[ClientAPI]:
    remoting = RemotingClient()
    try:
        yield ClientAPI(remoting)
    finally:
        await remoting.close()


@pytest.fixture(scope="session")
def tls_certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """A CA, a server certificate for 127.0.0.1 / localhost, client certificates (conf/devcerts.py)."""
    return make_certs(tmp_path_factory.mktemp("tls"))
