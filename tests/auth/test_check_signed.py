"""`protocol._speedups.check_signed` (C) against its twin `Authenticator.signer_py`: the same user
or the same refusal reason for signed, unsigned, malformed, unknown and forged requests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auth.authenticate import AuthenticationFailed, Authenticator
from auth.model import User
from protocol import signing
from protocol.command import RemotingCommand
from protocol.signing import ACCESS_KEY, NONCE, SIGNATURE, TIMESTAMP, Credentials, sign

check_signed: Any = signing.c_check_signed
pytestmark = pytest.mark.skipif(check_signed is None,
                                reason="protocol._speedups was not built, RQ_PURE_PYTHON is set or no libcrypto")
ALICE = Credentials("alice", "s3cret")
USERS = {"alice": User(username="alice", signing_key=ALICE.key, user_type="Normal"),
         "bob": User(username="bob", signing_key=Credentials("bob", "x").key, user_type="Super")}
AUTHENTICATOR = Authenticator(USERS.get)


def _twin(cmd: RemotingCommand) -> object:
    try:
        return AUTHENTICATOR.signer_py(cmd)
    except AuthenticationFailed as failed:
        return failed.reason


# integers up to 2**64 - 1: the largest msgpack carries, so the largest a request decoded from the wire holds
odd = st.one_of(st.none(), st.integers(-5, 2**64 - 1), st.text(max_size=70), st.booleans(), st.binary(max_size=8),
                st.just("bob"), st.just("alice"))


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200), changes=st.dictionaries(st.sampled_from([ACCESS_KEY, TIMESTAMP, NONCE,
                                                                             SIGNATURE, "topic"]),
                                                            st.one_of(odd, st.just(None)), max_size=3),
       drop=st.lists(st.sampled_from([ACCESS_KEY, TIMESTAMP, NONCE, SIGNATURE]), max_size=2))
def test_c_decides_as_the_twin(body: bytes, changes: dict[str, Any], drop: list[str]) -> None:
    cmd = RemotingCommand(code=10, fields={"topic": "orders", "queue_id": 1}, body=body)
    sign(cmd, ALICE)
    cmd.fields.update(changes)
    for name in drop:
        cmd.fields.pop(name, None)
    c = check_signed(cmd.code, cmd.fields, cmd.body, USERS.get)
    assert c is not None
    assert c == _twin(cmd)


def test_a_good_request_gives_its_user_and_a_bad_one_the_reason() -> None:
    cmd = RemotingCommand(code=10, fields={"topic": "orders"}, body=[b"a", b"b"])
    sign(cmd, ALICE)
    assert check_signed(10, cmd.fields, cmd.body, USERS.get) is USERS["alice"]
    assert check_signed(11, cmd.fields, cmd.body, USERS.get) == "bad signature"
    assert check_signed(10, {}, b"", USERS.get) == "no credentials"
    assert check_signed(10, dict(cmd.fields, auth_nonce="short"), cmd.body, USERS.get) == "malformed"
    assert check_signed(10, dict(cmd.fields, auth_access_key="carol"), cmd.body, USERS.get) == "unknown user"
    assert check_signed(10, dict(cmd.fields, k={1: 2}), cmd.body, USERS.get) is None      # the twin's to decide
