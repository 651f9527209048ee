"""`ServerAuth`: what a broker or a name server holds for authentication and authorization: its
users and ACLs (`AuthStore`), its `Enforcer` (with the audit log), the credentials it signs its
own requests with (`auth.inner_credentials`), and whether it is in protected mode. Each server
builds one with its own file locations and request-code map."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from auth.audit import AuditLog
from auth.enforcer import Enforcer
from auth.protected import protected, refusal_remark
from auth.requirements import CodeMap
from auth.store import AuthStore
from conf.auth import AuthConfig
from protocol.signing import Credentials

log = logging.getLogger(__name__)


def parse_credentials(spec: str) -> Credentials | None:
    """`"name:password"` → `Credentials` ("" → None; `AuthConfig` checked the form)."""
    if not spec:
        return None
    name, _, password = spec.partition(":")
    return Credentials(name, password)


class ServerAuth:
    """Built from the config alone (no IO). `store_path`: the users and ACLs file; `base_dir`: what
    a relative `auth.audit_log` is under; `server`: "broker" or "name server" (for messages).
    `start()` loads the store, creates `auth.init_user` as a Super user when it does not exist, and
    opens the audit log: raises `AuthModelError` (a store that cannot be read) or `OSError`.
    `stop()` closes the audit log (what is queued is written first)."""

    def __init__(self, config: AuthConfig, *, store_path: Path, base_dir: Path, code_map: CodeMap,
                 clock_ms: Callable[[], int], server: str, listen_host: str, protected_mode: bool) -> None:
        self.config = config
        self.store_path = store_path
        self._base_dir, self._code_map, self._clock_ms, self._server = base_dir, code_map, clock_ms, server
        self.store: AuthStore | None = None
        self.enforcer: Enforcer | None = None
        self.protected_remark = refusal_remark(server, listen_host) if protected(
            listen_host, protected_mode, config) else None
        self.inner_credentials = parse_credentials(config.inner_credentials)

    def start(self) -> None:
        config = self.config
        store = self.store = AuthStore(self.store_path)
        if config.init_user and store.ensure_user(config.init_user) is not None:
            log.info("created Super user %s (auth.init_user) in %s", config.init_user.partition(":")[0], store.path)
        audit = None
        if config.audit_log:
            path = Path(config.audit_log).expanduser()
            audit = AuditLog(path if path.is_absolute() else self._base_dir / path)
            audit.start()
        self.enforcer = Enforcer(store, config, self._code_map, self._clock_ms, audit=audit)
        if self.enforcer.enabled:
            log.info("%s: authentication on%s; %d users in %s", self._server,
                     ", authorization on" if config.authorization_enabled else "", len(store.users()), store.path)

    def stop(self) -> None:
        if self.enforcer is not None:
            self.enforcer.close()
            self.enforcer = None
