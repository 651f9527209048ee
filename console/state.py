"""The console's settings (`ConsoleSettings`) and what its routes share (`ConsoleState`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from admin.common import Connection
from client.admin_api import AdminAPI
from console.cluster_data import Rates, groups
from console.lag_history import LagHistory
from console.sessions import SessionStore, authentication_on


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleSettings:
    """`endpoint`: a broker or name server HOST:PORT; `connection`: how the console itself
    connects (its `--access-key` is used for the background lag samples, and with authentication
    off for every page); `listen_host`/`listen_port` (0: any free port); `sample_interval_ms`:
    how often every group's lag is sampled for the charts (the history keeps one hour);
    `refresh_interval_ms`: how often pages poll moving numbers."""

    endpoint: str
    connection: Connection = field(default_factory=Connection)
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    sample_interval_ms: int = 10_000
    refresh_interval_ms: int = 5_000
    shutdown_timeout_ms: int = 3_000


class ConsoleState:
    """What the routes share: settings, sessions, the console's own admin client (`api`), the
    lag history, the rate readings and whether the cluster wants a login (`auth_required`, None
    until first asked). Owned by `ConsoleServer`; closed by it."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.sessions = SessionStore()
        self.api = AdminAPI(settings.connection.remoting_client())
        self.history = LagHistory(max_points=max(1, 3_600_000 // max(settings.sample_interval_ms, 1)))
        self.rates = Rates()
        self.auth_required: bool | None = None

    async def needs_login(self) -> bool:
        """Whether pages need a login: the endpoint refuses unsigned requests (asked once, again
        after a failure to reach it)."""
        if self.auth_required is None:
            self.auth_required = await authentication_on(self.settings.connection, self.settings.endpoint)
        return self.auth_required

    async def sample_lag(self) -> None:
        """One lag sample of every group into the history (the console's own credentials)."""
        now_ms = int(time.time() * 1000)
        for row in await groups(self.api, self.settings.endpoint):
            self.history.record(row["group"], now_ms, row["total_lag"])

    async def close(self) -> None:
        await self.sessions.close()
        await self.api.remoting.close()
