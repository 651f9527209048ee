"""The pure parts of enforcement: `Enforcer` on a `ManualClock`, `FailureLimiter`, `AuditLog`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auth.audit import AuditLog
from auth.enforcer import Enforcer, Peer, refusal
from auth.model import AclEntry, Resource, User
from auth.ratelimit import FailureLimiter
from auth.requirements import on_group_and_topic
from auth.store import AuthStore
from conf.auth import AuthConfig
from protocol.clock import ManualClock
from protocol.command import RemotingCommand
from protocol.errors import NoPermission
from protocol.signing import Credentials, sign, signing_key

ALICE = Credentials("alice", "alice-secret")
PEER = Peer("127.0.0.1:50000")


def entry(resource: str, *actions: str, decision: str = "Allow") -> AclEntry:
    return AclEntry(resource=Resource.parse(resource), actions=frozenset(actions), decision=decision)  # type: ignore[arg-type]


def make(tmp_path: Path, clock: ManualClock, *, user_type: str = "Normal", entries: tuple[AclEntry, ...] = (),
         **config: object) -> Enforcer:
    store = AuthStore(tmp_path / "auth.json")
    store.create_user(User(username="alice", signing_key=signing_key("alice", "alice-secret"),
                           user_type=user_type))  # type: ignore[arg-type]
    if entries:
        store.put_acl("alice", entries, create=True)
    settings: dict[str, object] = {"authentication_enabled": True, "authorization_enabled": True}
    settings.update(config)
    return Enforcer(store, AuthConfig(**settings), {11: on_group_and_topic(("Sub",))},  # type: ignore[arg-type]
                    clock.now_ms)


def pull(clock: ManualClock, credentials: Credentials | None = ALICE, **fields: object) -> RemotingCommand:
    cmd = RemotingCommand(code=11, fields={"consumer_group": "g", "topic": "t", **fields})
    if credentials is not None:
        sign(cmd, credentials, now_ms=clock.now_ms())
    return cmd


def test_with_both_switches_off_nothing_is_checked(tmp_path: Path) -> None:
    clock = ManualClock()
    enforcer = make(tmp_path, clock, authentication_enabled=False, authorization_enabled=False)
    assert not enforcer.enabled
    assert enforcer.check(pull(clock, None), PEER) is None


def test_authorization_alone_still_authenticates(tmp_path: Path) -> None:
    clock = ManualClock()
    enforcer = make(tmp_path, clock, authentication_enabled=False, entries=(entry("*", "Sub"),))
    with pytest.raises(NoPermission, match=r"^NO_PERMISSION: authentication failed for an unsigned request$"):
        enforcer.check(pull(clock, None), PEER)
    assert enforcer.check(pull(clock), PEER) is not None


def test_authentication_alone_consults_no_acl(tmp_path: Path) -> None:
    clock = ManualClock()
    enforcer = make(tmp_path, clock, authorization_enabled=False)
    user = enforcer.check(pull(clock, topic="anything"), PEER)
    assert user is not None and user.username == "alice"


def test_a_code_missing_from_the_map_is_refused_to_a_normal_user_and_allowed_to_a_super_user(tmp_path: Path) -> None:
    clock = ManualClock()
    unknown = RemotingCommand(code=4242)
    sign(unknown, ALICE, now_ms=clock.now_ms())
    with pytest.raises(NoPermission, match=r"^NO_PERMISSION: User:alice has no permission to use request code 4242 \("):
        make(tmp_path / "n", clock, entries=(entry("*", "All"),)).check(unknown, PEER)
    sign(unknown, ALICE, now_ms=clock.now_ms())
    assert make(tmp_path / "s", clock, user_type="Super").check(unknown, PEER) is not None


def test_a_request_that_names_no_resource_is_refused(tmp_path: Path) -> None:
    clock = ManualClock()
    enforcer = make(tmp_path, clock, entries=(entry("*", "All"),))
    with pytest.raises(NoPermission, match="request code 11: field 'topic' names no resource"):
        enforcer.check(pull(clock, topic=7), PEER)


def test_a_connection_remembers_what_it_was_allowed_by_value_until_users_or_acls_change(tmp_path: Path) -> None:
    """The per-connection memo of allowed (user, code, group, topic): another topic is decided on
    its own, a changed ACL is applied to the next request, a field that cannot be a key is refused
    as naming no resource."""
    clock = ManualClock()
    enforcer = make(tmp_path, clock, entries=(entry("Topic:t", "Sub"), entry("Group:g", "Sub")))
    peer = Peer("127.0.0.1:50001")
    for _ in range(2):
        assert enforcer.check(pull(clock), peer) is not None
    assert peer.allowed_keys == {("alice", 11, "g", "t")}
    with pytest.raises(NoPermission, match=r"no permission to Sub on Topic:u \(request code 11\)"):
        enforcer.check(pull(clock, topic="u"), peer)
    with pytest.raises(NoPermission, match="field 'topic' names no resource"):
        enforcer.check(pull(clock, topic=["t"]), peer)
    enforcer.store.put_acl("alice", (entry("Topic:t", "Sub", decision="Deny"), entry("Group:g", "Sub")), create=False)
    with pytest.raises(NoPermission, match=r"no permission to Sub on Topic:t \(request code 11\)"):
        enforcer.check(pull(clock), peer)
    assert peer.allowed_keys == set()


def test_a_deny_matching_any_of_the_actions_wins() -> None:
    user = User(username="u", signing_key=bytes(32))
    entries = [entry("Topic:t", "Get"), entry("Topic:t", "Sub", decision="Deny")]
    assert refusal(user, entries, "Topic", "t", ("Get",), None) is None
    assert refusal(user, entries, "Topic", "t", ("Sub", "Get"), None) == "acl: denied by the Deny entry on Topic:t"
    assert refusal(user, entries, "Topic", "u", ("Get",), None) == "acl: no Allow entry matches"
    assert refusal(User(username="s", signing_key=bytes(32), user_type="Super"), entries, "Topic", "t", ("Sub",),
                   None) is None


def test_failures_are_limited_per_address_in_a_window_and_the_table_is_bounded() -> None:
    limiter = FailureLimiter(max_failures=2, window_ms=1_000, max_addresses=3)
    for _ in range(2):
        assert limiter.retry_after_ms("a", 0) == 0
        limiter.failed("a", 0)
    assert limiter.retry_after_ms("a", 400) == 600
    assert limiter.retry_after_ms("b", 400) == 0
    assert limiter.retry_after_ms("a", 1_000) == 0 and len(limiter) == 0
    limiter.failed("a", 2_000)
    limiter.failed("a", 3_100)       # a new window: one failure in it
    assert limiter.retry_after_ms("a", 3_100) == 0
    for address in ("b", "c", "d", "e"):
        limiter.failed(address, 3_200)
    assert len(limiter) == 3         # "a" failed least recently: forgotten


def test_the_enforcer_refuses_an_address_past_its_failures_until_the_window_ends(tmp_path: Path) -> None:
    clock = ManualClock()
    enforcer = make(tmp_path, clock, entries=(entry("*", "Sub"),), max_failures_per_address=2,
                    failure_window_ms=5_000)
    for _ in range(2):
        with pytest.raises(NoPermission, match="authentication failed for alice"):
            enforcer.check(pull(clock, Credentials("alice", "guess")), PEER)
    with pytest.raises(NoPermission, match=r"too many authentication failures from 127\.0\.0\.1; retry after 5000 ms"):
        enforcer.check(pull(clock), PEER)
    assert enforcer.check(pull(clock), Peer("10.1.2.3:4")) is not None    # another address is checked
    clock.advance(5_000)
    assert enforcer.check(pull(clock), PEER) is not None


def test_the_audit_log_is_bounded_says_what_it_dropped_and_rotates(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(path, max_queued=4, max_bytes=600)
    for index in range(10):      # not started: the queue fills, the rest is counted
        audit.record((index, "127.0.0.1", "u", 10, "Topic:t", "Pub", "allow", "acl"))
    assert audit.dropped == 6
    audit.start()
    assert audit.flush()
    audit.close()
    rotated = path.with_name("audit.log.1")
    lines = [json.loads(line) for p in (rotated, path) if p.exists() for line in p.read_text().splitlines()]
    assert [line.get("time") for line in lines[:4]] == [f"1970-01-01T00:00:00.00{i}Z" for i in range(4)]
    assert {"dropped": 6} in lines
    assert rotated.exists() and path.stat().st_mode & 0o777 == 0o600
