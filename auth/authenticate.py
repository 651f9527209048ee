"""`Authenticator`: who sent a signed request, or why it is refused (pure; the caller supplies
the clock and the users)."""

from __future__ import annotations

from collections.abc import Callable

from auth.model import User
from auth.nonces import NonceCache
from protocol.command import RemotingCommand
from protocol.signing import ACCESS_KEY, NONCE, TIMESTAMP, verify


class AuthenticationFailed(Exception):
    """`reason` is for the audit log only ("no credentials", "unknown user", "user disabled",
    "bad signature", "expired", "replayed", "malformed"); the client is told only that
    authentication failed (never which part of a signature was wrong)."""

    def __init__(self, reason: str, username: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.username = username


class Authenticator:
    """`authenticate(cmd, now_ms)` → the `User` whose signing key signed `cmd`; raises
    `AuthenticationFailed`. The timestamp must be within `max_clock_skew_ms` of `now_ms` and the
    nonce new within that window (`NonceCache`): a replayed frame is refused even when valid.
    The signature is checked before the nonce is remembered, so forged frames cannot fill it."""

    def __init__(self, users: Callable[[str], User | None], max_clock_skew_ms: int = 60_000,
                 max_nonces: int = 262_144) -> None:
        self._users = users
        self.nonces = NonceCache(max_clock_skew_ms, max_nonces)

    def authenticate(self, cmd: RemotingCommand, now_ms: int) -> User:
        fields = cmd.fields
        username = fields.get(ACCESS_KEY)
        if username is None:
            raise AuthenticationFailed("no credentials")
        timestamp, nonce = fields.get(TIMESTAMP), fields.get(NONCE)
        if (not isinstance(username, str) or type(timestamp) is not int or not isinstance(nonce, str)
                or not 8 <= len(nonce) <= 64):
            raise AuthenticationFailed("malformed", username if isinstance(username, str) else None)
        user = self._users(username)
        if user is None:
            raise AuthenticationFailed("unknown user", username)
        if not verify(cmd, user.signing_key):
            raise AuthenticationFailed("bad signature", username)
        if user.user_status != "enable":
            raise AuthenticationFailed("user disabled", username)
        refused = self.nonces.check(nonce, timestamp, now_ms)
        if refused is not None:
            raise AuthenticationFailed(refused, username)
        return user
