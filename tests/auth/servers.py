"""Helpers for the tests of authentication and authorization over TCP: secured brokers and name
servers in this process on port 0, clients signing with given credentials, and raw signed
requests (expired, replayed)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from broker.broker import Broker
from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient
from conf.auth import AuthConfig
from conf.namesrv import NamesrvConfig
from namesrv.namesrv import NameServer
from protocol.bodies import AclEntryData
from protocol.command import RemotingCommand
from protocol.signing import Credentials, sign
from tests.conftest import broker_config

ROOT = Credentials("root", "root-secret")
SECURED = AuthConfig(authentication_enabled=True, authorization_enabled=True, init_user="root:root-secret")


def secured(**overrides: object) -> AuthConfig:
    """`SECURED` with `overrides` (e.g. a higher `max_failures_per_address`)."""
    return replace(SECURED, **overrides)  # type: ignore[arg-type]


@asynccontextmanager
async def secured_broker(tmp_path: Path, auth: AuthConfig = SECURED, **overrides: object) -> AsyncIterator[Broker]:
    async with Broker(broker_config(tmp_path, auth=auth, **overrides)) as broker:
        yield broker


@asynccontextmanager
async def secured_namesrv(tmp_path: Path, auth: AuthConfig = SECURED, **overrides: object
                          ) -> AsyncIterator[NameServer]:
    fields: dict[str, object] = {"listen_port": 0, "config_dir": str(tmp_path / "namesrv"), "auth": auth}
    fields.update(overrides)
    async with NameServer(NamesrvConfig(**fields)) as namesrv:  # type: ignore[arg-type]
        yield namesrv


@asynccontextmanager
async def admin_as(credentials: Credentials | None) -> AsyncIterator[AdminAPI]:
    """An `AdminAPI` (a `ClientAPI` too) whose requests are signed with `credentials` (None: unsigned)."""
    remoting = RemotingClient(credentials=credentials)
    try:
        yield AdminAPI(remoting)
    finally:
        await remoting.close()


async def add_user(address: str, name: str, password: str, *entries: AclEntryData) -> Credentials:
    """Create a Normal user (as root) with an ACL of `entries` (none: no ACL); its credentials."""
    async with admin_as(ROOT) as root:
        await root.create_user(address, name, password)
        if entries:
            await root.create_acl(address, f"User:{name}", list(entries))
    return Credentials(name, password)


def allow(resource: str, *actions: str, decision: str = "Allow", source_ips: tuple[str, ...] = ()) -> AclEntryData:
    return AclEntryData(resource=resource, actions=list(actions), decision=decision, source_ips=list(source_ips))


def signed(cmd: RemotingCommand, credentials: Credentials, *, age_ms: int = 0) -> RemotingCommand:
    """`cmd` signed now (minus `age_ms`), in place; send it with an unsigned client to keep the
    signature (a client with credentials signs again)."""
    sign(cmd, credentials, now_ms=time.time_ns() // 1_000_000 - age_ms)
    return cmd


def copy_of(cmd: RemotingCommand) -> RemotingCommand:
    """The same request again (same fields, nonce and signature): a replay."""
    return RemotingCommand(code=cmd.code, flag=cmd.flag, fields=dict(cmd.fields), body=cmd.body)
