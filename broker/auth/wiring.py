"""The broker's `ServerAuth` and its AUTH_* handlers.

Files: users and ACLs in `auth.store_file`, else `<store.path>/config/auth.json` (mode 0600,
signing keys only); the audit log `auth.audit_log`, relative to `store.path` unless absolute."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path

from auth.admin import ADMIN_HANDLERS, WRITE_CODES, AdminHandler
from auth.server import ServerAuth
from auth.store import AuthStore
from broker.auth.code_map import BROKER_CODE_MAP
from broker.remoting.context import RequestContext
from broker.remoting.dispatcher import Handler, Reply
from conf.broker import BrokerConfig
from protocol.command import RemotingCommand


def store_path(config: BrokerConfig) -> Path:
    if config.auth.store_file:
        return Path(config.auth.store_file).expanduser()
    return config.store.path / "config" / "auth.json"


def broker_auth(config: BrokerConfig, clock_ms: Callable[[], int]) -> ServerAuth:
    return ServerAuth(config.auth, store_path=store_path(config), base_dir=config.store.path,
                      code_map=BROKER_CODE_MAP, clock_ms=clock_ms, server="broker", listen_host=config.listen_host,
                      protected_mode=config.protected_mode)


def auth_handlers(auth: ServerAuth) -> dict[int, Handler]:
    """The AUTH_* handlers on the broker's store (after `auth.start()`); the ones that write (an
    fsync) run in a thread, the loop never waits for the disk."""
    store = auth.store
    assert store is not None, "ServerAuth.start() first"
    return {code: _handler(store, handler, code in WRITE_CODES) for code, handler in ADMIN_HANDLERS.items()}


def _handler(store: AuthStore, handler: AdminHandler, writes: bool) -> Handler:
    call = functools.partial(handler, store)
    if not writes:
        def read(ctx: RequestContext, request: RemotingCommand) -> Reply:
            return call(request)
        return read

    async def write(ctx: RequestContext, request: RemotingCommand) -> Reply:
        return await asyncio.to_thread(call, request)
    return write
