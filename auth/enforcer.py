"""`Enforcer`: the one check every request of a broker or a name server goes through, before any
handler sees it (pure: no asyncio, no IO on the caller's thread; the audit log has a thread).

In order:
1. **Rate limit.** An address with `max_failures_per_address` authentication failures within
   `failure_window_ms` is refused unchecked until that window ends (`FailureLimiter`).
2. **Authentication** (when `authentication_enabled`, and also when only `authorization_enabled`:
   an ACL needs to know who asks). The request must be signed by a known, enabled user with a fresh
   timestamp and an unseen nonce (`Authenticator`); an unsigned request is refused. The client is
   told `authentication failed for <access key>` and nothing about which part failed; the audit
   log gets the reason.
3. **Authorization** (when `authorization_enabled`). A Super user passes. For a Normal user the
   request code is looked up in the code map: its builder gives the `Requirement`s (resource,
   actions) read from the request's fields or body, and each must be allowed by the user's ACL
   (`auth.model.authorize` for any one of the actions, a Deny matching any of them wins). **A
   request code with no entry in the map is refused**, so a code added to a server without an
   entry is closed, not open. Refusal remark: `User:<name> has no permission to <Action> on
   <Resource> (request code <n>)`, with `Sub or Get` when any of several actions would do.
   Each connection remembers what it was allowed (`Peer`): the requirement pairs, and for a code
   whose builder decides from a few fields alone (`auth.requirements.keyed`) the (user, code,
   values) whole (`known_key`, in C when `auth._checks` was built), so a producer's next send to
   the same topic skips the builder and the ACL;
   both are dropped when users or ACLs change (the store's `generation`). With an audit log on,
   every request is decided in full (the log names each one's resources).

Refusals raise `protocol.errors.NoPermission` (NO_PERMISSION, 16). Passwords and keys never reach
a remark, a log line or the audit log (the audit log has the claimed user name and the reason)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence

from auth.audit import AuditLog
from auth.authenticate import AuthenticationFailed, Authenticator
from auth.model import AclEntry, User, authorize
from auth.ratelimit import FailureLimiter
from auth.requirements import KEY_FIELDS, CodeMap, Requirement, ResourceUnknown, describe
from auth.store import AuthStore
from conf.auth import AuthConfig
from protocol.command import RemotingCommand
from protocol.errors import NoPermission
from protocol.native import load
from protocol.signing import ACCESS_KEY

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_MAX_NAME_IN_REMARK = 64


_MAX_CACHED = 1_024        # allowed (user, requirement) pairs, and (user, code, values) keys, per connection
_NOTHING: frozenset[tuple[object, ...]] = frozenset()


def known_key_py(allowed_keys: set[tuple[object, ...]] | frozenset[tuple[object, ...]], username: str, code: int,
                 fields: dict[str, object], names: tuple[str, ...]) -> bool | tuple[object, ...] | None:
    """True when (`username`, `code`, the values of `names` in `fields`, None when missing) is in
    `allowed_keys`, else that key; None when `fields` is not exactly a dict or a value is not
    hashable (not a name: the builder refuses it). The twin of `auth._checks.known_key`."""
    if type(fields) is not dict:
        return None
    key = (username, code, *map(fields.get, names))
    try:
        return True if key in allowed_keys else key
    except TypeError:
        return None


_CHECKS = load("auth._checks")
known_key: Callable[..., bool | tuple[object, ...] | None] = (
    _CHECKS.known_key if _CHECKS is not None else known_key_py)


class Peer:
    """What the enforcer keeps per connection: the peer's IP as text (`ip`) and parsed (`address`,
    None when it is not an IP, e.g. an in-process transport), parsed once, not per request; the
    (user, requirement) pairs already allowed from it (`allowed`, at most 1,024) and the requests
    allowed whole (`allowed_keys`: (user, code, the values of the code's `KEY_FIELDS`), at most
    1,024), both valid while the store's `generation` is the one they were decided at."""

    __slots__ = ("address", "allowed", "allowed_keys", "generation", "ip")

    def __init__(self, remote_address: str) -> None:
        self.allowed: set[tuple[str, Requirement]] = set()
        self.allowed_keys: set[tuple[object, ...]] = set()
        self.generation = -1
        host = remote_address.rpartition(":")[0] if ":" in remote_address else remote_address
        self.ip = host.strip("[]")
        try:
            self.address: IpAddress | None = ipaddress.ip_address(self.ip)
        except ValueError:
            self.address = None


def refusal(user: User, entries: Sequence[AclEntry], kind: str, name: str, actions: tuple[str, ...],
            address: IpAddress | None) -> str | None:
    """None when `entries` allow `user` any one of `actions` on the resource from `address`, else
    why not (for the audit log): a Deny entry matching any of the actions wins over every Allow
    (RocketMQ's `isMatchAction` takes any of the actions)."""
    allowed = False
    for action in actions:
        outcome = authorize(user, entries, kind, name, action, address)
        if outcome.entry is not None and outcome.entry.decision == "Deny":
            return f"acl: denied by the Deny entry on {outcome.entry.resource}"
        allowed = allowed or outcome.allowed
    return None if allowed else "acl: no Allow entry matches"


def _printable(name: object) -> str:
    text = name if isinstance(name, str) else repr(name)
    text = "".join(c if c.isprintable() else "?" for c in text[:_MAX_NAME_IN_REMARK])
    return text + ("..." if isinstance(name, str) and len(name) > _MAX_NAME_IN_REMARK else "")


class Enforcer:
    """`check(request, peer)` → the authenticated `User` (None when both switches are off), or
    raises `NoPermission`. `code_map`: request code → `RequirementBuilder` (see
    `auth.requirements`); `clock_ms`: epoch ms (the signatures' timestamps are epoch ms);
    `audit`: where decisions go (None: nowhere). `enabled` is False when both switches are off:
    servers then skip `check` altogether."""

    def __init__(self, store: AuthStore, config: AuthConfig, code_map: CodeMap, clock_ms: Callable[[], int], *,
                 audit: AuditLog | None = None) -> None:
        self.store = store
        self.authorizing = config.authorization_enabled
        self.enabled = config.authentication_enabled or config.authorization_enabled
        self.authenticator = Authenticator(store.user, config.max_clock_skew_ms, config.max_nonces)
        self.limiter = FailureLimiter(config.max_failures_per_address, config.failure_window_ms)
        self._code_map = code_map
        # code -> its builder's key fields (`auth.requirements.keyed`): a request whose (user, code,
        # values) was allowed from a connection is allowed again without the builder or the ACL
        self._key_fields = {code: KEY_FIELDS[builder] for code, builder in code_map.items() if builder in KEY_FIELDS}
        self._clock_ms = clock_ms
        self.audit = audit

    def check(self, request: RemotingCommand, peer: Peer) -> User | None:
        if not self.enabled:
            return None
        now_ms = self._clock_ms()
        limiter = self.limiter
        if limiter.windows and (retry_after_ms := limiter.retry_after_ms(peer.ip, now_ms)):
            self._record(now_ms, peer, request.fields.get(ACCESS_KEY), request.code, "-", "-", "deny", "rate limited")
            raise NoPermission(f"too many authentication failures from {peer.ip}; retry after {retry_after_ms} ms")
        try:
            user = self.authenticator.authenticate(request, now_ms)
        except AuthenticationFailed as failed:
            self.limiter.failed(peer.ip, now_ms)
            claimed = request.fields.get(ACCESS_KEY)
            self._record(now_ms, peer, claimed, request.code, "-", "-", "deny",
                         f"authentication: {failed.reason}")
            who = _printable(claimed) if claimed is not None else "an unsigned request"
            raise NoPermission(f"authentication failed for {who}") from None
        if self.authorizing and user.user_type != "Super":
            names = self._key_fields.get(request.code)      # (`_authorize`'s first step, inline: every request)
            if (names is None or self.audit is not None or peer.generation != self.store.generation
                    or known_key(peer.allowed_keys, user.username, request.code, request.fields, names) is not True):
                self._authorize(request, peer, user, now_ms)
        elif self.audit is not None:
            self._record(now_ms, peer, user.username, request.code, "*" if self.authorizing else "-", "-", "allow",
                         "super user" if self.authorizing else "authenticated")
        return user

    def authenticated_elsewhere(self, peer: Peer, claimed: str | None, reason: str | None) -> None:
        """For a server that checks its own kind of signature (the gRPC API's): `reason` None
        records nothing; else the failure counts towards the address's rate limit and is audited
        as `check` audits one. Raises `NoPermission` when the address is rate limited (then before
        anything else) or `reason` is given."""
        now_ms = self._clock_ms()
        retry_after_ms = self.limiter.retry_after_ms(peer.ip, now_ms)
        if retry_after_ms:
            self._record(now_ms, peer, claimed, 0, "-", "-", "deny", "rate limited")
            raise NoPermission(f"too many authentication failures from {peer.ip}; retry after {retry_after_ms} ms")
        if reason is not None:
            self.limiter.failed(peer.ip, now_ms)
            self._record(now_ms, peer, claimed, 0, "-", "-", "deny", f"authentication: {reason}")
            who = _printable(claimed) if claimed is not None else "an unsigned request"
            raise NoPermission(f"authentication failed for {who}")

    def authorize(self, request: RemotingCommand, peer: Peer, user: User) -> None:
        """`check`'s authorization step alone, for a `user` authenticated another way (the gRPC
        API translates each call to the request it stands for): raises `NoPermission` as `check`."""
        if self.authorizing and user.user_type != "Super":
            self._authorize(request, peer, user, self._clock_ms())

    def _authorize(self, request: RemotingCommand, peer: Peer, user: User, now_ms: int) -> None:
        code = request.code
        store = self.store
        names = self._key_fields.get(code)
        key: tuple[object, ...] | None = None
        if names is not None and self.audit is None:    # (an audit log records each request's resources)
            found = known_key(peer.allowed_keys if peer.generation == store.generation else _NOTHING,
                              user.username, code, request.fields, names)
            if found is True:
                return
            key = found if isinstance(found, tuple) else None
        builder = self._code_map.get(code)
        if builder is None:
            self._record(now_ms, peer, user.username, code, "-", "-", "deny", "request code not in the code map")
            raise NoPermission(f"User:{user.username} has no permission to use request code {code} "
                               "(no resource is mapped for it)")
        try:
            required = builder(request)
        except ResourceUnknown as exc:
            self._record(now_ms, peer, user.username, code, "-", "-", "deny", str(exc))
            raise NoPermission(f"User:{user.username} has no permission to use request code {code}: {exc}") from None
        username, allowed = user.username, peer.allowed
        if peer.generation != store.generation:      # users or ACLs changed: decide again
            allowed.clear()
            peer.allowed_keys.clear()
            peer.generation = store.generation
        for requirement in required:
            if (username, requirement) in allowed:
                continue
            kind, name, actions = requirement
            why = refusal(user, store.acl(username), kind, name, actions, peer.address)
            if why is not None:
                self._deny(now_ms, peer, user, code, requirement, why)
            if len(allowed) < _MAX_CACHED:
                allowed.add((username, requirement))
        if key is not None and len(peer.allowed_keys) < _MAX_CACHED:
            peer.allowed_keys.add(key)
        if self.audit is not None:
            self._record(now_ms, peer, user.username, code, ",".join(describe(k, n) for k, n, _ in required) or "-",
                         ",".join("|".join(a) for _, _, a in required) or "-", "allow", "acl")

    def _deny(self, now_ms: int, peer: Peer, user: User, code: int, requirement: Requirement, why: str) -> None:
        kind, name, actions = requirement
        resource = describe(kind, name)
        self._record(now_ms, peer, user.username, code, resource, "|".join(actions), "deny", why)
        raise NoPermission(f"User:{user.username} has no permission to {' or '.join(actions)} on {resource} "
                           f"(request code {code})")

    def _record(self, now_ms: int, peer: Peer, user: object, code: int, resource: str, action: str, verdict: str,
                reason: str) -> None:
        if self.audit is not None:
            self.audit.record((now_ms, peer.ip, _printable(user) if user is not None else None, code, resource,
                               action, verdict, reason))

    def close(self) -> None:
        """Stop the audit log's writer (what is queued is written first)."""
        if self.audit is not None:
            self.audit.close()
