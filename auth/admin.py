"""The AUTH_* request codes (RocketMQ 5.3's ACL 2.0 admin codes 3001-3010), as pure functions of
an `AuthStore` and a request, shared by the broker and the name server (docs/protocol.md has the
wire form). Each returns the SUCCESS response or raises `SystemError_` (SYSTEM_ERROR): a missing or
invalid value names the field and what it may be; "already exists" / "no user x" is the store's
message. Who may call them is the `Enforcer`'s business (Cluster Update for changes, Cluster Get
for reads: in practice a Super user), not this module's.

Users are sent with their signing key (64 hex digits of `protocol.signing.signing_key`), never a
password; answers never carry a key. Writes save the store's file (an fsync): callers that must
not block run them in a thread."""

from __future__ import annotations

from collections.abc import Callable

from auth.model import (
    USER_TYPES,
    AclEntry,
    AuthModelError,
    Resource,
    User,
    check_username,
    parse_actions,
    parse_networks,
    subject_user,
)
from auth.store import AuthStore, AuthStoreError
from protocol.bodies import AclEntryData, AclInfo, UserInfo, decode_body, encode_body
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.errors import SystemError_
from protocol.headers_v5 import (
    CreateUserRequestHeader,
    DeleteAclRequestHeader,
    GetAclRequestHeader,
    ListAclsRequestHeader,
    ListUsersRequestHeader,
    UpdateUserRequestHeader,
    UserRequestHeader,
)
from protocol.signing import KEY_BYTES

AdminHandler = Callable[[AuthStore, RemotingCommand], RemotingCommand]
USER_STATUSES = ("enable", "disable")
# The codes that change the store (the rest only read it).
WRITE_CODES = frozenset({RequestCode.AUTH_CREATE_USER, RequestCode.AUTH_UPDATE_USER, RequestCode.AUTH_DELETE_USER,
                         RequestCode.AUTH_CREATE_ACL, RequestCode.AUTH_UPDATE_ACL, RequestCode.AUTH_DELETE_ACL})


def _invalid(field: str, exc: Exception | str) -> SystemError_:
    return SystemError_(f"field {field!r}: {exc}")


def _username(value: str, field: str = "username") -> str:
    try:
        return check_username(value)
    except AuthModelError as exc:
        raise _invalid(field, exc) from None


def _subject(value: str) -> str:
    try:
        return subject_user(value)
    except AuthModelError as exc:
        raise _invalid("subject", exc) from None


def _signing_key(value: str) -> bytes:
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise _invalid("signing_key", f"must be {KEY_BYTES * 2} hex digits (protocol.signing.signing_key)")
    return key


def _choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise _invalid(field, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _user_info(user: User) -> UserInfo:
    return UserInfo(username=user.username, user_type=user.user_type, user_status=user.user_status)


def _entry_data(entry: AclEntry) -> AclEntryData:
    return AclEntryData(resource=str(entry.resource), actions=sorted(entry.actions), decision=entry.decision,
                        source_ips=[str(n) for n in entry.source_ips])


def _entry(index: int, data: AclEntryData) -> AclEntry:
    try:
        return AclEntry(resource=Resource.parse(data.resource), actions=parse_actions(data.actions),
                        decision=data.decision, source_ips=parse_networks(data.source_ips))  # type: ignore[arg-type]
    except AuthModelError as exc:
        raise _invalid(f"entries[{index}]", exc) from None


def _stored(action: Callable[[], object]) -> None:
    try:
        action()
    except AuthStoreError as exc:
        raise SystemError_(str(exc)) from None


# -- users ------------------------------------------------------------------------------------------

def create_user(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_CREATE_USER: ext `username`, `signing_key`, `user_type` ("Normal" when absent)."""
    header = CreateUserRequestHeader.from_fields(request.fields)
    user = User(username=_username(header.username), signing_key=_signing_key(header.signing_key),
                user_type=_choice("user_type", header.user_type, USER_TYPES))  # type: ignore[arg-type]
    _stored(lambda: store.create_user(user))
    return request.response()


def update_user(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_UPDATE_USER: ext `username`; `signing_key`, `user_type`, `user_status` when changed."""
    header = UpdateUserRequestHeader.from_fields(request.fields)
    old = store.user(_username(header.username))
    if old is None:
        raise SystemError_(f"no user {header.username}")
    user = User(username=old.username,
                signing_key=old.signing_key if header.signing_key is None else _signing_key(header.signing_key),
                user_type=old.user_type if header.user_type is None else _choice(  # type: ignore[arg-type]
                    "user_type", header.user_type, USER_TYPES),
                user_status=old.user_status if header.user_status is None else _choice(  # type: ignore[arg-type]
                    "user_status", header.user_status, USER_STATUSES))
    _stored(lambda: store.update_user(user))
    return request.response()


def delete_user(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_DELETE_USER: ext `username`; its ACL goes with it."""
    username = _username(UserRequestHeader.from_fields(request.fields).username)
    _stored(lambda: store.delete_user(username))
    return request.response()


def get_user(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_GET_USER: ext `username` → body `UserInfo` (never the key)."""
    username = _username(UserRequestHeader.from_fields(request.fields).username)
    user = store.user(username)
    if user is None:
        raise SystemError_(f"no user {username}")
    return request.response(body=encode_body(_user_info(user)))


def list_users(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_LIST_USER: ext `filter` (a substring of the name) → body: array of `UserInfo`, by name."""
    header = ListUsersRequestHeader.from_fields(request.fields)
    return request.response(body=encode_body([_user_info(u) for u in store.users(header.filter or "")]))


# -- ACLs -------------------------------------------------------------------------------------------

def _put_acl(store: AuthStore, request: RemotingCommand, *, create: bool) -> RemotingCommand:
    info = decode_body(AclInfo, request.body_bytes())
    username = _subject(info.subject)
    if not info.entries:
        raise _invalid("entries", "an ACL needs at least one entry")
    entries = [_entry(index, data) for index, data in enumerate(info.entries)]
    _stored(lambda: store.put_acl(username, entries, create=create))
    return request.response()


def create_acl(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_CREATE_ACL: body `AclInfo`; refused when the subject already has an entry for one of
    these resources (and networks), or does not exist."""
    return _put_acl(store, request, create=True)


def update_acl(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_UPDATE_ACL: body `AclInfo`; replaces the entries of the same resources (and networks)
    of an existing ACL, adds the others."""
    return _put_acl(store, request, create=False)


def delete_acl(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_DELETE_ACL: ext `subject`, `resources` (comma-separated patterns; absent: the whole ACL)."""
    header = DeleteAclRequestHeader.from_fields(request.fields)
    username = _subject(header.subject)
    resources: list[str] = []
    for text in (header.resources or "").split(","):
        if text.strip():
            try:
                resources.append(str(Resource.parse(text)))
            except AuthModelError as exc:
                raise _invalid("resources", exc) from None
    _stored(lambda: store.delete_acl(username, resources))
    return request.response()


def get_acl(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_GET_ACL: ext `subject` → body `AclInfo` (no entries when the user has no ACL)."""
    header = GetAclRequestHeader.from_fields(request.fields)
    username = _subject(header.subject)
    if store.user(username) is None:
        raise SystemError_(f"no user {username}")
    entries = [_entry_data(e) for e in store.acl(username)]
    return request.response(body=encode_body(AclInfo(subject=header.subject, entries=entries)))


def list_acls(store: AuthStore, request: RemotingCommand) -> RemotingCommand:
    """AUTH_LIST_ACL: ext `subject_filter`, `resource_filter` → body: array of `AclInfo`, by subject."""
    header = ListAclsRequestHeader.from_fields(request.fields)
    acls = store.acls(header.subject_filter or "", header.resource_filter or "")
    return request.response(body=encode_body([AclInfo(subject=f"User:{name}", entries=[_entry_data(e) for e in entries])
                                              for name, entries in acls.items()]))


ADMIN_HANDLERS: dict[int, AdminHandler] = {
    RequestCode.AUTH_CREATE_USER: create_user,
    RequestCode.AUTH_UPDATE_USER: update_user,
    RequestCode.AUTH_DELETE_USER: delete_user,
    RequestCode.AUTH_GET_USER: get_user,
    RequestCode.AUTH_LIST_USER: list_users,
    RequestCode.AUTH_CREATE_ACL: create_acl,
    RequestCode.AUTH_UPDATE_ACL: update_acl,
    RequestCode.AUTH_DELETE_ACL: delete_acl,
    RequestCode.AUTH_GET_ACL: get_acl,
    RequestCode.AUTH_LIST_ACL: list_acls,
}
