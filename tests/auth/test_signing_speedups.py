"""`protocol._speedups.sign_fields` and `signature_matches` (C, SHA-256 from libcrypto) against
their twins `protocol.signing.sign_py` and `verify_py`: the same fields and signature for every
request, the same verdict for every claimed signature, and "the twin does it" (False / None)
for what the C functions do not take."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import native, signing
from protocol.command import RemotingCommand
from protocol.signing import SIGNATURE, Credentials, sign, sign_py, verify, verify_py

speedups: Any = native.speedups()
pytestmark = pytest.mark.skipif(signing._c_sign_fields is None,
                                reason="protocol._speedups was not built, RQ_PURE_PYTHON is set or no libcrypto")
CREDENTIALS = Credentials("alice", "s3cret")
OTHER = Credentials("bob", "other")
scalars = st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=40), st.booleans(), st.none(),
                    st.binary(max_size=300), st.floats(allow_nan=False))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=10), st.dictionaries(st.text(max_size=8), inner, max_size=10)), max_leaves=30)
bodies = st.one_of(st.binary(max_size=3000), st.binary(max_size=300).map(bytearray),
                   st.binary(max_size=300).map(lambda raw: memoryview(raw)),
                   st.lists(st.binary(max_size=200), max_size=5),
                   st.lists(st.binary(max_size=50), max_size=3).map(tuple))
keys = st.one_of(st.just(CREDENTIALS.key), st.binary(min_size=0, max_size=130))


def _command(code: int, fields: dict[str, Any], body: Any) -> RemotingCommand:
    return RemotingCommand(code=code, fields=dict(fields), body=body)


@settings(max_examples=300, deadline=None)
@given(code=st.integers(0, 65_535), fields=st.dictionaries(st.text(max_size=20), values, max_size=12), body=bodies,
       timestamp_ms=st.integers(0, 2**63 - 1), nonce=st.text(max_size=64), key=keys)
def test_c_signs_as_the_twin(code: int, fields: dict[str, Any], body: Any, timestamp_ms: int, nonce: str,
                             key: bytes) -> None:
    fields[SIGNATURE] = "stale"
    c_cmd, py_cmd = _command(code, fields, body), _command(code, fields, body)
    credentials = Credentials("alice", "x")
    object.__setattr__(credentials, "key", key)
    assert speedups.sign_fields(c_cmd.fields, code, body, "alice", timestamp_ms, nonce, key) is True
    sign_py(py_cmd, credentials, timestamp_ms, nonce)
    assert list(c_cmd.fields.items()) == list(py_cmd.fields.items())
    assert speedups.signature_matches(code, c_cmd.fields, body, key) is True
    assert verify_py(c_cmd, key) is True


def test_the_signature_is_rfc_2104_hmac_sha256_of_the_canonical_bytes() -> None:
    cmd = _command(10, {"topic": "t"}, [b"ab", bytearray(b"cd")])
    sign(cmd, CREDENTIALS, now_ms=1, nonce="0" * 32)
    expected = hmac.new(CREDENTIALS.key, signing.canonical_bytes(10, cmd.fields, b"abcd"), hashlib.sha256).hexdigest()
    assert cmd.fields[SIGNATURE] == expected


@settings(max_examples=200, deadline=None)
@given(claimed=st.one_of(st.text(min_size=60, max_size=66), st.binary(max_size=64), st.integers(), st.none()),
       flip=st.integers(0, 63), body=bodies)
def test_c_verdicts_agree_with_the_twin(claimed: object, flip: int, body: Any) -> None:
    cmd = _command(11, {"topic": "orders", "n": [1, {"b": 2, "a": None}]}, body)
    sign(cmd, CREDENTIALS)
    good = cmd.fields[SIGNATURE]
    for candidate in (good, good[:flip] + ("0" if good[flip] != "0" else "1") + good[flip + 1:], good.upper(),
                      claimed):
        cmd.fields[SIGNATURE] = candidate
        for key in (CREDENTIALS.key, OTHER.key):
            assert speedups.signature_matches(11, cmd.fields, body, key) == verify_py(cmd, key)
            assert verify(cmd, key) == verify_py(cmd, key)
    del cmd.fields[SIGNATURE]
    assert speedups.signature_matches(11, cmd.fields, body, CREDENTIALS.key) is False


class Text(str):
    pass


@pytest.mark.parametrize("fields, body, key", [
    ({"k": {1: "int key"}}, b"", CREDENTIALS.key),              # unsortable map: the twin raises / refuses
    ({"k": 2**64}, b"", CREDENTIALS.key),                       # not a msgpack int
    ({"k": "v"}, iter([b"a"]), CREDENTIALS.key),                # another body type
    ({"k": "v"}, [b"a", "text"], CREDENTIALS.key),              # a body part that is no buffer
    ({"k": "v"}, b"", bytearray(CREDENTIALS.key)),              # a key that is not bytes
])
def test_c_hands_what_it_does_not_take_to_the_twin(fields: dict[str, Any], body: Any, key: Any) -> None:
    assert speedups.sign_fields(dict(fields), 10, body, "alice", 1, "n" * 32, key) is False
    signed = dict(fields, **{SIGNATURE: "a" * 64})
    assert speedups.signature_matches(10, signed, body, key) is None
    assert speedups.signature_matches(10, dict(fields, **{SIGNATURE: Text("a" * 64)}), b"", CREDENTIALS.key) is None


def test_non_ascii_signatures_are_refused_not_raised() -> None:
    cmd = _command(10, {"topic": "t"}, b"")
    sign(cmd, CREDENTIALS)
    cmd.fields[SIGNATURE] = "é" * 64
    assert verify(cmd, CREDENTIALS.key) is False and verify_py(cmd, CREDENTIALS.key) is False
