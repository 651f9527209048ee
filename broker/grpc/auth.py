"""Who a gRPC call comes from: the RocketMQ 5 clients' `Credentials(ak, sk)` signature, checked
against the broker's users and ACLs (its `auth.enforcer.Enforcer`).

A signed call carries `x-mq-date-time` (`%Y%m%dT%H%M%SZ`) and `authorization`:
`MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>`, the signature
being HMAC-SHA1 of the date-time keyed by the secret key (RocketMQ's `DefaultAuthenticationProvider`
for gRPC). The broker never holds a password, only each user's derived signing key
(`protocol.signing.signing_key`), so a RocketMQ client's secret key is that key in hex:
`Credentials("billing", signing_key("billing", "s3cret").hex())`. The clients stamp their local
time (not UTC), so the date-time is only checked to be within a day of now; replay protection is
as weak as RocketMQ's own here (its signature covers the date-time alone)."""

from __future__ import annotations

import hmac
from calendar import timegm
from collections.abc import Callable, Sequence
from hashlib import sha1
from time import strptime

from auth.enforcer import Enforcer, Peer
from auth.model import User
from protocol.command import RemotingCommand

DATE_TIME = "x-mq-date-time"
AUTHORIZATION = "authorization"
CLIENT_ID = "x-mq-client-id"
ALGORITHM = "MQv2-HMAC-SHA1"
MAX_DATE_TIME_SKEW_MS = 26 * 3_600_000      # any time zone's local time, plus two hours of drift


def sign(secret_key: str, date_time: str) -> str:
    """The hex HMAC-SHA1 of `date_time` keyed by `secret_key` (what the clients send)."""
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


def parse_authorization(value: str) -> tuple[str, str] | None:
    """(access key, signature) of an `authorization` value, None when it is not one."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    parts: dict[str, str] = {}
    for item in rest.split(","):
        key, sep, val = item.strip().partition("=")
        if sep:
            parts[key] = val
    access_key, signature = parts.get("Credential", ""), parts.get("Signature", "")
    if not access_key or not signature:
        return None
    return access_key, signature


def peer_of(grpc_peer: str) -> Peer:
    """The enforcer's `Peer` of a gRPC peer string ("ipv4:1.2.3.4:5", "ipv6:[::1]:5")."""
    address = grpc_peer.partition(":")[2] if grpc_peer.startswith(("ipv4:", "ipv6:")) else grpc_peer
    return Peer(address)


def metadata_value(metadata: Sequence[tuple[str, str | bytes]] | None, key: str) -> str | None:
    for name, value in metadata or ():
        if name == key:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


class GrpcAuth:
    """`user(metadata, peer, now_ms)` → the signing `User` (None when the broker checks nothing);
    raises `NoPermission` (answered UNAUTHORIZED) for a missing, malformed or wrong signature, an
    unknown or disabled user, or a rate-limited address. `authorize(request, peer, user)` raises
    `NoPermission` (FORBIDDEN) when the user's ACLs do not allow the request a call stands for."""

    def __init__(self, enforcer: Callable[[], Enforcer | None]) -> None:
        self._enforcer = enforcer

    @property
    def enabled(self) -> bool:
        enforcer = self._enforcer()
        return enforcer is not None and enforcer.enabled

    def user(self, metadata: Sequence[tuple[str, str | bytes]] | None, peer: Peer, now_ms: int) -> User | None:
        enforcer = self._enforcer()
        if enforcer is None or not enforcer.enabled:
            return None
        claimed, reason, user = None, None, None
        header = metadata_value(metadata, AUTHORIZATION)
        date_time = metadata_value(metadata, DATE_TIME)
        parsed = parse_authorization(header) if header else None
        if header is None:
            reason = "no credentials"
        elif parsed is None or date_time is None:
            reason = "malformed"
        else:
            claimed, signature = parsed
            user = enforcer.store.user(claimed)
            reason = self._refusal(user, signature, date_time, now_ms)
        enforcer.authenticated_elsewhere(peer, claimed, reason)
        return user

    @staticmethod
    def _refusal(user: User | None, signature: str, date_time: str, now_ms: int) -> str | None:
        if user is None:
            return "unknown user"
        try:
            stamped_ms = timegm(strptime(date_time, "%Y%m%dT%H%M%SZ")) * 1000
        except ValueError:
            return "malformed"
        if abs(stamped_ms - now_ms) > MAX_DATE_TIME_SKEW_MS:
            return "expired"
        if not hmac.compare_digest(sign(user.signing_key.hex(), date_time), signature.lower()):
            return "bad signature"
        if user.user_status != "enable":
            return "user disabled"
        return None

    def authorize(self, request: RemotingCommand, peer: Peer, user: User | None) -> None:
        enforcer = self._enforcer()
        if enforcer is not None and user is not None:
            enforcer.authorize(request, peer, user)
