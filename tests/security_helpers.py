"""What the tests of secured clients, the admin CLI and the demo share: a broker config with
authentication and authorization on and a Super user `admin`, an admin API signed as that user,
and a Normal user with an ACL made in one call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient
from conf.auth import AuthConfig
from conf.broker import BrokerConfig
from protocol.bodies import AclEntryData
from protocol.signing import Credentials
from tests.conftest import broker_config

ADMIN = Credentials("admin", "admin-secret")
SECURED = AuthConfig(authentication_enabled=True, authorization_enabled=True,
                     init_user=f"{ADMIN.access_key}:{ADMIN.secret_key}")


def secured_config(tmp_path: Path, *, lenient: bool = False, **overrides: object) -> BrokerConfig:
    """`tests.conftest.broker_config` with authentication and authorization on, `ADMIN` its Super
    user; `lenient`: no practical bound on refusals per address (tests that fail on purpose often,
    all from 127.0.0.1, would otherwise lock out the admin too)."""
    auth = replace(SECURED, max_failures_per_address=1_000_000) if lenient else SECURED
    return broker_config(tmp_path, **{"auth": auth, **overrides})


@asynccontextmanager
async def admin_api(credentials: Credentials = ADMIN) -> AsyncIterator[AdminAPI]:
    remoting = RemotingClient(credentials=credentials)
    try:
        yield AdminAPI(remoting)
    finally:
        await remoting.close()


async def add_user(address: str, username: str, allow: Sequence[tuple[str, Sequence[str]]],
                   password: str = "user-secret") -> Credentials:
    """A Normal user at `address` whose ACL allows each (resource, actions) of `allow`."""
    async with admin_api() as api:
        await api.create_user(address, username, password, "Normal")
        if allow:
            entries = [AclEntryData(resource=resource, actions=list(actions)) for resource, actions in allow]
            await api.create_acl(address, f"User:{username}", entries)
    return Credentials(username, password)
