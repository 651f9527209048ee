"""Fixtures of the gRPC API's tests: a broker serving it in process (the official client's
generated modules and ours hold byte-identical descriptors, so both load in one process), and
`blocking`, which runs the official client's blocking calls in a thread with a bounded wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from broker.broker import Broker
from tests.conftest import broker_config
from tests.helpers import free_port

T = TypeVar("T")


async def blocking(fn: Callable[..., T], *args: object, timeout_s: float = 20.0) -> T:
    """`fn(*args)` in a worker thread, waited for at most `timeout_s`."""
    return await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout_s)


def endpoint(broker: Broker) -> str:
    assert broker.grpc is not None
    return f"127.0.0.1:{broker.grpc.port}"


@pytest.fixture
async def grpc_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(broker_config(tmp_path, grpc_port=free_port(), pop_revive_interval_ms=100,
                                    transaction_timeout_ms=300, transaction_check_interval_ms=100)) as broker:
        yield broker
