"""`[auth]`: users, request signatures and ACLs (issue #37; RocketMQ 5.3's ACL 2.0 names where it
has them). Both switches are off by default, so the embedded default stays one command."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from conf.ranges import Range, check_ranges


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    RANGES: ClassVar[Mapping[str, Range]] = MappingProxyType({
        "max_clock_skew_ms": Range(1_000, 3_600_000), "max_nonces": Range(1_024, 16_777_216),
        "max_failures_per_address": Range(low=1), "failure_window_ms": Range(low=1_000)})

    authentication_enabled: bool = False   # every request must be signed by a known user (else NO_PERMISSION)
    authorization_enabled: bool = False    # every request allowed by its user's ACL (Super: all); authenticates too
    init_user: str = ""                    # "name:password": a Super user created at first start if absent
    inner_credentials: str = ""            # "name:password" this server signs with towards name servers, brokers
    store_file: str = ""                   # users and ACLs (mode 0600); "": <store>/config/auth.json (broker)
    max_clock_skew_ms: int = 60_000        # a signed request's timestamp this far from the clock: refused
    max_nonces: int = 262_144              # nonces remembered against replay; past it the skew window shrinks
    max_failures_per_address: int = 20    # authentication failures of one peer IP per window; more: refused unchecked
    failure_window_ms: int = 10_000        # the window of max_failures_per_address
    audit_log: str = ""                    # one JSON line per decision ("": off); relative: to store.path / config_dir

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES)
        for name in ("init_user", "inner_credentials"):
            value = getattr(self, name)
            if value and (":" not in value or not value.partition(":")[0] or not value.partition(":")[2]):
                raise ValueError(f"auth.{name} must be \"name:password\"")
