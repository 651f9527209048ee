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

from admin.cluster import name_server_brokers
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


async def _refuses(api: AdminAPI, address: str) -> bool | None:
    """Whether the server at `address` refuses `api`'s HEART_BEAT with no groups (nothing to
    authorize: only authentication can refuse it); None when it is a name server (which answers
    REQUEST_CODE_NOT_SUPPORTED, after checking the signature when its own authentication is on)."""
    try:
        await api.send_heartbeat(address, HeartbeatData(client_id=LOGIN_CLIENT_ID))
    except NoPermission:
        return True
    except RequestCodeNotSupported:
        return None
    return False


async def _listed_brokers(api: AdminAPI, name_server: str) -> list[str] | None:
    """The address of every broker the name server lists; None when it refuses `api` (its
    authentication is on and the signature is wrong)."""
    try:
        return [address for _, address in await name_server_brokers(api, name_server)]
    except NoPermission:
        return None


async def authentication_on(connection: Connection, address: str) -> bool:
    """Whether the broker at `address` refuses an unsigned request, or, `address` being a name
    server, whether it or any broker it lists does (the brokers hold the users; the name server
    may have authentication off). Raises what the admin client raises when a server cannot be
    reached."""
    api = AdminAPI(dataclasses.replace(connection, access_key="", secret_key="").remoting_client())
    try:
        refused = await _refuses(api, address)
        if refused is not None:
            return refused
        brokers = await _listed_brokers(api, address)
        if brokers is None:
            return True
        for broker in brokers:
            if await _refuses(api, broker):
                return True
        return False
    finally:
        await api.remoting.close()


async def _prove(api: AdminAPI, address: str) -> str:
    """Prove `api`'s user name and password by a signed request to the broker at `address`, or,
    `address` being a name server, to every broker it lists (each must accept it: a user one of
    them does not know cannot read the cluster). Returns a broker that accepted. Raises
    `LoginFailed`."""
    refused = await _refuses(api, address)
    if refused is False:
        return address
    brokers = None if refused else await _listed_brokers(api, address)
    if brokers is None:
        raise LoginFailed("wrong user name or password")
    if not brokers:
        raise LoginFailed(f"cannot check the password: the name server at {address} lists no broker")
    for broker in brokers:
        if await _refuses(api, broker):
            raise LoginFailed("wrong user name or password")
    return brokers[0]


async def login(connection: Connection, address: str, username: str, password: str) -> tuple[AdminAPI, bool]:
    """Check `username`/`password` by a request signed with the key derived from them (a
    HEART_BEAT with no groups, which any authenticated user may send) to the broker at
    `address`, or to every broker the name server at `address` lists (`_prove`), then ask a
    broker that accepted for the user's own record (AUTH_GET_USER) whether it is `Super`: a user
    the broker does not let read it is treated as Normal (RocketMQ's dashboard: read-only).
    Returns the user's admin client (the caller closes it) and whether the user may act. Raises
    `LoginFailed`, or what the admin client raises when a server cannot be reached."""
    if not username:
        raise LoginFailed("give a user name")
    api = AdminAPI(dataclasses.replace(connection, access_key=username, secret_key=password).remoting_client())
    try:
        broker = await _prove(api, address)
        try:
            user = await api.get_user(broker, username)
        except NoPermission:
            return api, False
    except BaseException:
        await api.remoting.close()
        raise
    return api, user.user_type == "Super"
