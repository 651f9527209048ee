"""`Authenticator`: who sent a signed request, or why it is refused (pure; the caller supplies
the clock and the users)."""

from __future__ import annotations

from collections.abc import Callable

from auth.model import User
from auth.nonces import nonce_cache
from protocol.command import RemotingCommand
from protocol.signing import ACCESS_KEY, NONCE, TIMESTAMP, c_check_signed, verify


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
    nonce new within that window (`auth.nonces.NonceCache`, in C when built): a replayed frame is
    refused even when valid.
    The signature is checked before the nonce is remembered, so forged frames cannot fill it.
    The fields, the user and the signature are checked in one C call
    (`protocol._speedups.check_signed`) when it was built, else (or for what it does not take)
    by `signer_py`."""

    def __init__(self, users: Callable[[str], User | None], max_clock_skew_ms: int = 60_000,
                 max_nonces: int = 262_144) -> None:
        self._users = users
        self.nonces = nonce_cache(max_clock_skew_ms, max_nonces)

    def authenticate(self, cmd: RemotingCommand, now_ms: int) -> User:
        fields = cmd.fields
        checked = c_check_signed(cmd.code, fields, cmd.body, self._users) if c_check_signed is not None else None
        if checked is None:
            user = self.signer_py(cmd)
        elif type(checked) is str:
            username = fields.get(ACCESS_KEY)
            raise AuthenticationFailed(checked, username if isinstance(username, str) else None)
        else:
            user = checked
        if user.user_status != "enable":
            raise AuthenticationFailed("user disabled", user.username)
        refused = self.nonces.check(fields[NONCE], fields[TIMESTAMP], now_ms)
        if refused is not None:
            raise AuthenticationFailed(refused, user.username)
        return user

    def signer_py(self, cmd: RemotingCommand) -> User:
        """The user whose key signed `cmd` (its fields checked, the user known, the signature
        right), else raises `AuthenticationFailed`: the twin of `protocol._speedups.check_signed`."""
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
        return user
