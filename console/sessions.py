"""Who is using the console: server-side sessions behind a signed cookie, and the login check.

The cookie (`rq_console`, HttpOnly, SameSite=Strict, signed with the console's random per-process
key through itsdangerous) holds only a random session id: the user's password stays in this
process's memory (in its `Credentials`, which the session's admin client signs requests with) and
never reaches the browser, a URL or a log. Each session has a CSRF token that every POST form
carries (`csrf_token`), and a flag `admin` saying whether the user may act (topic create/delete,
offset reset, DLQ resend): always with authentication off; a `Super` user with it on (RocketMQ's
dashboard: a "normal" user is read-only). Sessions end on logout, after `idle_timeout_ms` unused,
or when more than `max_sessions` exist (the least recently used goes first)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from itsdangerous import BadSignature, TimestampSigner

from admin.common import Connection
from client.admin_api import AdminAPI
from protocol.bodies import HeartbeatData
from protocol.errors import NoPermission, RequestCodeNotSupported

COOKIE_NAME = "rq_console"
LOGIN_CLIENT_ID = "rocketq-console-login"


@dataclass(slots=True)
class Session:
    """One browser's login: `username` ("" when authentication is off), `admin` (may act),
    `api` (its own admin client, signed as the user), `csrf_token` (hex), `last_used_ms`."""

    session_id: str
    username: str
    admin: bool
    api: AdminAPI
    csrf_token: str = field(default_factory=lambda: secrets.token_hex(16))
    last_used_ms: int = 0
    owns_api: bool = True           # False: the console's shared client (authentication off)

    async def close(self) -> None:
        if self.owns_api:
            await self.api.remoting.close()


class SessionStore:
    """Sessions by id, bounded (`max_sessions`, `idle_timeout_ms`); cookie values are the id
    signed with `secret` (`cookie_value`, `lookup`). Expired or evicted sessions are closed."""

    def __init__(self, *, secret: bytes | None = None, max_sessions: int = 1_000,
                 idle_timeout_ms: int = 8 * 3_600_000) -> None:
        self._signer = TimestampSigner(secret or secrets.token_bytes(32), salt="rocketq-console-session")
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.max_sessions, self.idle_timeout_ms = max_sessions, idle_timeout_ms

    def cookie_value(self, session: Session) -> str:
        return self._signer.sign(session.session_id).decode()

    async def add(self, username: str, admin: bool, api: AdminAPI, *, owns_api: bool = True) -> Session:
        session = Session(secrets.token_hex(16), username, admin, api, last_used_ms=_now_ms(), owns_api=owns_api)
        self._sessions[session.session_id] = session
        while len(self._sessions) > self.max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            await oldest.close()
        return session

    async def lookup(self, cookie: str | None) -> Session | None:
        """The live session of a cookie value; None for a missing, forged, unknown or idle one."""
        if not cookie:
            return None
        try:
            session_id = self._signer.unsign(cookie).decode()
        except BadSignature:
            return None
        session = self._sessions.get(session_id)
        now_ms = _now_ms()
        if session is None:
            return None
        if now_ms - session.last_used_ms > self.idle_timeout_ms:
            await self.remove(session)
            return None
        session.last_used_ms = now_ms
        self._sessions.move_to_end(session_id)
        return session

    async def remove(self, session: Session) -> None:
        if self._sessions.pop(session.session_id, None) is not None:
            await session.close()

    async def close(self) -> None:
        while self._sessions:
            _, session = self._sessions.popitem()
            await session.close()

    def __len__(self) -> int:
        return len(self._sessions)


def _now_ms() -> int:
    return int(time.time() * 1000)


class LoginFailed(Exception):
    """The broker did not accept the user name and password (or the user is disabled)."""


async def authentication_on(connection: Connection, address: str) -> bool:
    """Whether the broker or name server at `address` refuses an unsigned request (HEART_BEAT with
    no groups: nothing to authorize, so only authentication can refuse it). Raises what the
    admin client raises when `address` cannot be reached."""
    remoting = dataclasses.replace(connection, access_key="", secret_key="").remoting_client()
    try:
        await AdminAPI(remoting).send_heartbeat(address, HeartbeatData(client_id=LOGIN_CLIENT_ID))
    except NoPermission:
        return True
    except RequestCodeNotSupported:
        return False
    finally:
        await remoting.close()
    return False


async def login(connection: Connection, address: str, username: str, password: str) -> tuple[AdminAPI, bool]:
    """Check `username`/`password` by a request signed with the key derived from them (a
    HEART_BEAT with no groups, which any authenticated user may send) to the broker at
    `address`, then ask the user's own record (AUTH_GET_USER) whether it is `Super`: a user the
    broker does not let read it is treated as Normal. Returns the user's admin client (the caller
    closes it) and whether the user may act. Raises `LoginFailed`."""
    if not username:
        raise LoginFailed("give a user name")
    api = AdminAPI(dataclasses.replace(connection, access_key=username, secret_key=password).remoting_client())
    try:
        await api.send_heartbeat(address, HeartbeatData(client_id=LOGIN_CLIENT_ID))
    except NoPermission:
        await api.remoting.close()
        raise LoginFailed("wrong user name or password") from None
    except RequestCodeNotSupported:
        pass                                  # a name server: the request was authenticated first
    except BaseException:
        await api.remoting.close()
        raise
    try:
        user = await api.get_user(address, username)
    except NoPermission:
        return api, False
    return api, user.user_type == "Super"
