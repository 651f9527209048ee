"""`AuthStore`: the users and ACLs of one broker or name server, in one JSON file (mode 0600).

The file holds each user's derived signing key (hex), never a password. Every change is written
atomically (a temporary file, fsync, rename, fsync of the directory) before the call returns, so
a change that was answered survives a crash. The file is small (a user ~150 bytes, an ACL entry
~120): callers on an event loop may write it inline or in a thread."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from auth.model import AclEntry, AuthModelError, User, check_username
from protocol.atomic import write_bytes_atomic
from protocol.signing import signing_key

FILE_MODE = 0o600


class AuthStoreError(ValueError):
    """A change that cannot be made (a user that exists already, or does not exist); the message
    says which."""


class AuthStore:
    """Users by name and ACL entries by user name, loaded from `path` when it exists (raises
    `AuthModelError` or `ValueError` naming the file when it cannot be read), saved on each change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._users: dict[str, User] = {}
        # `user(name)` → the User or None: the dict's own `get` (C), not a method around it: the
        # enforcer looks a user up on every signed request (`_users` is only ever changed in place).
        self.user: Callable[[str], User | None] = self._users.get
        self._acls: dict[str, tuple[AclEntry, ...]] = {}
        self._lock = threading.Lock()
        self.generation = 0         # +1 on every change (callers drop what they derived from the old state)
        if path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            for value in data.get("users", []):
                user = User(username=value["username"], signing_key=bytes.fromhex(value["signing_key"]),
                            user_type=value.get("user_type", "Normal"), user_status=value.get("user_status", "enable"))
                self._users[user.username] = user
            for name, entries in data.get("acls", {}).items():
                self._acls[check_username(name)] = tuple(AclEntry.from_json(e) for e in entries)
        except (KeyError, TypeError, ValueError) as exc:
            raise AuthModelError(f"{self.path}: cannot be read ({exc})") from None
        os.chmod(self.path, FILE_MODE)

    def _save(self) -> None:
        self.generation += 1
        users = sorted(self._users.values(), key=lambda u: u.username)
        data = {"users": [{"username": u.username, "signing_key": u.signing_key.hex(), "user_type": u.user_type,
                           "user_status": u.user_status} for u in users],
                "acls": {name: [e.to_json() for e in entries] for name, entries in sorted(self._acls.items())}}
        write_bytes_atomic(self.path, json.dumps(data, indent=1).encode(), FILE_MODE)

    # users
    def users(self, name_filter: str = "") -> list[User]:
        """Users whose name contains `name_filter`, by name."""
        return sorted((u for u in self._users.values() if name_filter in u.username), key=lambda u: u.username)

    def create_user(self, user: User) -> None:
        with self._lock:
            if user.username in self._users:
                raise AuthStoreError(f"user {user.username} already exists")
            self._users[user.username] = user
            self._save()

    def update_user(self, user: User) -> None:
        with self._lock:
            if user.username not in self._users:
                raise AuthStoreError(f"no user {user.username}")
            self._users[user.username] = user
            self._save()

    def delete_user(self, username: str) -> None:
        """Deletes the user and its ACL; raises `AuthStoreError` when there is no such user."""
        with self._lock:
            if self._users.pop(username, None) is None:
                raise AuthStoreError(f"no user {username}")
            self._acls.pop(username, None)
            self._save()

    def ensure_user(self, spec: str, user_type: str = "Super") -> User | None:
        """`"name:password"` (a config's `init_user`): create that user when it does not exist (an
        existing one is left as it is, so a password changed later stays changed). Returns the user
        created, or None. Raises `AuthModelError` when `spec` has no `:`."""
        name, sep, password = spec.partition(":")
        if not sep or not password:
            raise AuthModelError("init_user must be \"name:password\"")
        with self._lock:
            if name in self._users:
                return None
            user = User(username=name, signing_key=signing_key(name, password), user_type=user_type)  # type: ignore[arg-type]
            self._users[name] = user
            self._save()
            return user

    # ACLs
    def acl(self, username: str) -> tuple[AclEntry, ...]:
        """The entries of `User:<username>` (empty when it has none)."""
        return self._acls.get(username, ())

    def acls(self, subject_filter: str = "", resource_filter: str = "") -> dict[str, tuple[AclEntry, ...]]:
        """User name → entries, for users whose name contains `subject_filter` and entries whose
        resource text contains `resource_filter`."""
        result = {}
        for name, entries in sorted(self._acls.items()):
            if subject_filter in name:
                chosen = tuple(e for e in entries if resource_filter in str(e.resource))
                if chosen:
                    result[name] = chosen
        return result

    def put_acl(self, username: str, entries: Iterable[AclEntry], *, create: bool) -> None:
        """Add `entries` to the user's ACL, replacing entries of the same resource (and the same
        source networks). `create=True` (AUTH_CREATE_ACL) needs no ACL for those resources yet;
        `create=False` (AUTH_UPDATE_ACL) needs the user to have an ACL. Raises `AuthStoreError`
        when the user does not exist or that condition does not hold."""
        new = tuple(entries)
        with self._lock:
            if username not in self._users:
                raise AuthStoreError(f"no user {username}")
            old = self._acls.get(username, ())
            keys = {(e.resource, e.source_ips) for e in new}
            clashes = sorted(str(e.resource) for e in old if (e.resource, e.source_ips) in keys)
            if create and clashes:
                raise AuthStoreError(f"User:{username} already has an ACL for {', '.join(clashes)}")
            if not create and not old:
                raise AuthStoreError(f"User:{username} has no ACL to update")
            self._acls[username] = tuple(e for e in old if (e.resource, e.source_ips) not in keys) + new
            self._save()

    def delete_acl(self, username: str, resources: Iterable[str] = ()) -> None:
        """Remove the entries of those resources (none given: the whole ACL); raises
        `AuthStoreError` when the user has no ACL."""
        wanted = set(resources)
        with self._lock:
            old = self._acls.get(username)
            if not old:
                raise AuthStoreError(f"User:{username} has no ACL")
            kept = tuple(e for e in old if wanted and str(e.resource) not in wanted)
            if kept:
                self._acls[username] = kept
            else:
                del self._acls[username]
            self._save()
