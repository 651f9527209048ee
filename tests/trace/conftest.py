"""The trace tests' admin client (QUERY_MESSAGE_TRACE and the admin requests) over TCP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient


@pytest.fixture
async def admin_api() -> AsyncIterator[AdminAPI]:
    remoting = RemotingClient()
    try:
        yield AdminAPI(remoting)
    finally:
        await remoting.close()
