"""Users and ACLs, modelled on RocketMQ 5.3's ACL 2.0.

A `User` is a name, the signing key derived from its password (`protocol.signing.signing_key`:
the password itself is never stored), a type (`Super`: everything; `Normal`: what its ACLs
allow) and a status. An `Acl` belongs to a subject (`User:<name>`) and holds `AclEntry`s, each a
resource pattern, a set of actions, optional source networks and a decision.

Resources: `Cluster`, `Topic:<name>`, `Group:<name>`, a prefix (`Topic:orders-*`), a type's every
name (`Topic:*`) or `*` (every resource). Actions: `Pub`, `Sub`, `Create`, `Update`, `Delete`,
`Get`, `List`, `All` (every action)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

UserType = Literal["Super", "Normal"]
UserStatus = Literal["enable", "disable"]
Decision = Literal["Allow", "Deny"]
ResourceType = Literal["Cluster", "Topic", "Group", "Any"]
ACTIONS = ("Pub", "Sub", "Create", "Update", "Delete", "Get", "List", "All")
USER_TYPES = ("Super", "Normal")
DECISIONS = ("Allow", "Deny")
_NAME = re.compile(r"^[%|a-zA-Z0-9_.-]{1,255}$")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class AuthModelError(ValueError):
    """A user, resource, action, decision or network that cannot be parsed; the message names it."""


def check_username(name: str) -> str:
    """`name` when it is a valid user name (1-255 of `[%|a-zA-Z0-9_.-]`); raises `AuthModelError`."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise AuthModelError(f"user name {name!r} must be 1-255 characters of letters, digits, %|_.-")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class User:
    """`signing_key` is 32 bytes (never printed); `user_type` "Super" or "Normal"."""

    username: str
    signing_key: bytes = field(repr=False)
    user_type: UserType = "Normal"
    user_status: UserStatus = "enable"

    def __post_init__(self) -> None:
        check_username(self.username)
        if len(self.signing_key) != 32:
            raise AuthModelError("a user's signing key is 32 bytes")
        if self.user_type not in USER_TYPES:
            raise AuthModelError(f"user type {self.user_type!r} is not one of {', '.join(USER_TYPES)}")
        if self.user_status not in ("enable", "disable"):
            raise AuthModelError(f"user status {self.user_status!r} is not enable or disable")


@dataclass(frozen=True, slots=True)
class Resource:
    """`Resource.parse("Topic:orders-*")` → type "Topic", name "orders", prefix True. `*` is type
    "Any"; `Topic:*` is every topic (name "", prefix True)."""

    type: ResourceType
    name: str = ""
    prefix: bool = False

    @classmethod
    def parse(cls, text: str) -> Resource:
        """Raises `AuthModelError` naming `text` when it is not a resource pattern."""
        text = text.strip()
        if text == "*":
            return cls("Any", "", True)
        if text == "Cluster" or text.startswith("Cluster:"):
            return cls("Cluster", "", True)
        kind, sep, name = text.partition(":")
        if not sep or kind not in ("Topic", "Group") or not name:
            raise AuthModelError(f"resource {text!r} is not Cluster, Topic:<name>, Group:<name>, a prefix "
                                 "(Topic:orders-*) or *")
        prefix = name.endswith("*")
        name = name[:-1] if prefix else name
        if "*" in name or (name and not _NAME.match(name)):
            raise AuthModelError(f"resource {text!r}: a name is letters, digits and %|_.- with one trailing *")
        return cls(kind, name, prefix)  # type: ignore[arg-type]

    def matches(self, kind: str, name: str) -> bool:
        """Whether this pattern covers resource `kind` ("Cluster", "Topic", "Group") named `name`."""
        if self.type == "Any":
            return True
        if self.type != kind:
            return False
        return name.startswith(self.name) if self.prefix else name == self.name

    def __str__(self) -> str:
        if self.type == "Any":
            return "*"
        if self.type == "Cluster":
            return "Cluster"
        return f"{self.type}:{self.name}{'*' if self.prefix else ''}"


def parse_actions(actions: Iterable[str]) -> frozenset[str]:
    """The action names, checked; raises `AuthModelError` naming an unknown one."""
    result = set()
    for action in actions:
        action = action.strip()
        if action not in ACTIONS:
            raise AuthModelError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
        result.add(action)
    if not result:
        raise AuthModelError("an ACL entry needs at least one action")
    return frozenset(result)


def parse_networks(networks: Iterable[str]) -> tuple[Network, ...]:
    """`["10.0.0.0/8", "192.168.1.7"]` → networks; raises `AuthModelError` naming a bad one."""
    result = []
    for text in networks:
        text = text.strip()
        if not text:
            continue
        try:
            result.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise AuthModelError(f"source network {text!r} is not an address or a CIDR network") from None
    return tuple(result)


@dataclass(frozen=True, slots=True, kw_only=True)
class AclEntry:
    """One rule: `actions` on `resource` from `source_ips` (empty: from anywhere) → `decision`."""

    resource: Resource
    actions: frozenset[str]
    decision: Decision = "Allow"
    source_ips: tuple[Network, ...] = ()

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise AuthModelError(f"decision {self.decision!r} is not Allow or Deny")

    def covers(self, kind: str, name: str, action: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
               ) -> bool:
        if not self.resource.matches(kind, name):
            return False
        if action not in self.actions and "All" not in self.actions:
            return False
        return not self.source_ips or (address is not None and any(address in net for net in self.source_ips))

    def to_json(self) -> dict[str, object]:
        return {"resource": str(self.resource), "actions": sorted(self.actions), "decision": self.decision,
                "source_ips": [str(n) for n in self.source_ips]}

    @classmethod
    def from_json(cls, value: dict[str, object]) -> AclEntry:
        return cls(resource=Resource.parse(str(value["resource"])),
                   actions=parse_actions(value["actions"]),  # type: ignore[arg-type]
                   decision=value.get("decision", "Allow"),  # type: ignore[arg-type]
                   source_ips=parse_networks(value.get("source_ips", ())))  # type: ignore[arg-type]


def subject_user(subject: str) -> str:
    """`"User:billing"` → `"billing"`; raises `AuthModelError` for another form."""
    kind, sep, name = subject.partition(":")
    if kind != "User" or not sep:
        raise AuthModelError(f"subject {subject!r} is not User:<name>")
    return check_username(name)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of an authorization: `allowed`, and the entry that decided (None: no entry
    matched, which denies)."""

    allowed: bool
    entry: AclEntry | None = None


def authorize(user: User, entries: Iterable[AclEntry], kind: str, name: str, action: str,
              address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> Verdict:
    """May `user` do `action` on resource `kind`/`name` from `address`? A `Super` user may do
    anything; otherwise a matching `Deny` entry wins over any `Allow`, and no matching entry
    denies (ACL 2.0's rules; RocketMQ also orders matches by how exact the resource is, which
    changes nothing when deny always wins)."""
    if user.user_type == "Super":
        return Verdict(True)
    allow = None
    for entry in entries:
        if entry.covers(kind, name, action, address):
            if entry.decision == "Deny":
                return Verdict(False, entry)
            allow = allow or entry
    return Verdict(allow is not None, allow)
