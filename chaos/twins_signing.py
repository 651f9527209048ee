"""The request-signature checks of `chaos.twins`: `canonical_bytes`, `sign_fields` and
`signature_matches` and `check_signed` (`protocol._speedups`) against their twins in
`protocol.signing` and `auth.authenticate`, and `NonceCache` (`auth._checks`) against
`auth.nonces`'s and `known_key` against `auth.enforcer`'s; on random
ext maps (the values `chaos.twins` draws: every msgpack type, deep maps, odd text), bodies
(bytes, bytearrays, memoryviews, lists and tuples of them, and other values), keys of every length
and claimed signatures right, flipped, cut, and of other types."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import random
from typing import Any

from auth.authenticate import AuthenticationFailed, Authenticator
from auth.enforcer import known_key_py
from auth.model import User
from auth.nonces import NonceCache
from protocol.command import RemotingCommand
from protocol.signing import SCHEME, SIGNATURE, Credentials, canonical_bytes_py, sign_py, verify_py


def _outcome(function: Any, *args: Any) -> Any:
    try:
        return "ok", function(*args)
    except Exception as exc:
        return "error", type(exc), str(exc)


def _fields(rng: random.Random, value: Any, text: Any) -> dict[str, Any]:
    fields = {text(rng): value(rng) for _ in range(rng.randint(0, 5))}
    if rng.random() < 0.5:
        fields.update(topic="orders", queue_id=rng.randrange(8), properties={"UNIQ_KEY": "K", "KEYS": "a b"})
    if rng.random() < 0.3:
        fields[SIGNATURE] = rng.choice(["0" * 64, "stale", 7])
    return fields


_CREDENTIALS = Credentials("user", "-")


def _credentials(key: bytes) -> Credentials:
    """Credentials signing with `key` (deriving a key per case would take 5 ms)."""
    credentials = copy.copy(_CREDENTIALS)
    object.__setattr__(credentials, "key", key)
    return credentials


def _key(rng: random.Random) -> bytes:
    return rng.choice([b"k" * 32, b"", rng.randbytes(rng.randint(0, 130))])


def check_canonical_bytes(rng: random.Random, speedups: Any, value: Any, text: Any, same: Any) -> bool:
    fields = _fields(rng, value, text)
    code = rng.choice([10, 320, rng.randrange(-5, 1 << 17)])
    digest = hashlib.sha256(rng.randbytes(8)).digest()
    c = _outcome(speedups.canonical_bytes, SCHEME, code, fields, SIGNATURE, digest)
    if c == ("ok", None):
        return False
    same("canonical_bytes", (code, fields), _outcome(canonical_bytes_py, code, fields, digest), c)
    return True


def check_sign_fields(rng: random.Random, speedups: Any, value: Any, text: Any, same: Any, body: Any) -> bool:
    fields, code, request_body, key = _fields(rng, value, text), rng.choice([10, 11, 320]), body(rng), _key(rng)
    timestamp_ms, nonce = rng.randrange(1 << 45), rng.randbytes(16).hex()
    c_fields = dict(fields)
    c = _outcome(speedups.sign_fields, c_fields, code, request_body, "user", timestamp_ms, nonce, key)
    if c == ("ok", False):
        return False
    cmd = RemotingCommand(code=code, fields=dict(fields), body=request_body)
    python = _outcome(sign_py, cmd, _credentials(key), timestamp_ms, nonce)
    same("sign_fields", (fields, code, request_body, key), (python, list(cmd.fields.items())),
         (("ok", None) if c == ("ok", True) else c, list(c_fields.items())))
    return True


def check_signature_matches(rng: random.Random, speedups: Any, value: Any, text: Any, same: Any,
                            body: Any) -> bool:
    fields, code, request_body, key = _fields(rng, value, text), rng.choice([10, 11, 320]), body(rng), _key(rng)
    cmd = RemotingCommand(code=code, fields=fields, body=request_body)
    try:
        sign_py(cmd, _credentials(key), 1, "n" * 32)
    except Exception:
        cmd.fields[SIGNATURE] = "0" * 64
    claimed = cmd.fields[SIGNATURE]
    kind = rng.randrange(6)
    if kind == 1:
        at = rng.randrange(64)
        cmd.fields[SIGNATURE] = claimed[:at] + rng.choice("0f") + claimed[at + 1:]
    elif kind == 2:
        cmd.fields[SIGNATURE] = claimed[:rng.randrange(64)]
    elif kind == 3:
        cmd.fields[SIGNATURE] = rng.choice([None, 5, claimed.encode(), "é" * 64, claimed.upper()])
    elif kind == 4:
        key = _key(rng)
    c = _outcome(speedups.signature_matches, code, cmd.fields, request_body, key)
    if c == ("ok", None):
        return False
    same("signature_matches", (cmd.fields, code, request_body, key), _outcome(verify_py, cmd, key), c)
    return True


_USERS: dict[str, Any] = {}


def check_check_signed(rng: random.Random, speedups: Any, value: Any, text: Any, same: Any, body: Any) -> bool:
    if not _USERS:
        _USERS["user"] = User(username="user", signing_key=b"k" * 32)
    fields, code, request_body = _fields(rng, value, text), rng.choice([10, 11, 320]), body(rng)
    cmd = RemotingCommand(code=code, fields=fields, body=request_body)
    with contextlib.suppress(Exception):       # (fields the twin cannot sign: left unsigned)
        sign_py(cmd, _credentials(b"k" * 32), rng.randrange(1 << 45), rng.randbytes(rng.choice([2, 16])).hex())
    for _ in range(rng.randint(0, 2)):
        name = rng.choice(["auth_access_key", "auth_timestamp_ms", "auth_nonce", SIGNATURE])
        if rng.random() < 0.3:
            cmd.fields.pop(name, None)
        else:
            cmd.fields[name] = rng.choice([value(rng), "user", "other", None])
    c = _outcome(speedups.check_signed, code, cmd.fields, request_body, _USERS.get)
    if c == ("ok", None):
        return False

    def twin() -> Any:
        try:
            return Authenticator(_USERS.get).signer_py(cmd)
        except AuthenticationFailed as failed:
            return failed.reason
    same("check_signed", (cmd.fields, code, request_body), _outcome(twin), c)
    return True


def check_nonce_cache(rng: random.Random, nonces: Any, same: Any) -> bool:
    """Both `NonceCache`s (`auth._checks`, twin `auth.nonces`) of one small window and bound driven
    by the same checks: a few nonces (some repeated, now and then not a str or not hashable),
    timestamps around the clock, far beyond it and around zero, a clock that also goes back;
    every verdict (an exception by its type), size and floor compared."""
    window_ms, bound = rng.choice([0, 1, 999, 1_000, 5_000]), rng.randint(1, 8)
    now_ms = rng.choice([0, -3_000, 1_700_000_000_000])
    calls: list[tuple[Any, int, int]] = []
    for _ in range(rng.randint(1, 40)):
        now_ms += rng.choice([0, 1, 499, 1_000, rng.randint(-2_000, 7_000)])
        nonce = rng.choice([f"n{rng.randint(0, 9)}", f"n{rng.randint(0, 9)}", "", 5, b"n1", ("n", 1), ["n"]])
        timestamp_ms = rng.choice([now_ms + rng.randint(-2 * window_ms - 2, 2 * window_ms + 2), now_ms,
                                   rng.choice([2**62 + 1, -(2**62) - 1, 2**64, 0, -1])])
        calls.append((nonce, timestamp_ms, now_ms))

    def run(make: Any) -> Any:
        cache = make(window_ms, bound)
        answers = []
        for call in calls:
            answer = _outcome(cache.check, *call)
            answers.append((answer[:2] if answer[0] == "error" else answer, len(cache), cache.floor_ms))
        return answers
    same("nonce_cache", (window_ms, bound, calls), run(NonceCache), run(nonces.NonceCache))
    return True


def check_known_key(rng: random.Random, checks: Any, value: Any, text: Any, same: Any) -> bool:
    """`known_key` (`auth._checks`) against `auth.enforcer.known_key_py`: ext maps of random values
    (unhashable ones too) or other values, names present and missing, the key remembered or not."""
    names = tuple(rng.choice(["a", "b", text(rng)]) for _ in range(rng.randint(0, 3)))
    fields: Any = {name: value(rng) for name in ("a", "b") if rng.random() < 0.7}
    if rng.random() < 0.1:
        fields = rng.choice([None, [1], "a", ("a", 1)])
    username, code = rng.choice(["u", "", "\u00e9"]), rng.choice([10, 11, -1, 2**70])
    allowed: set[Any] = set()
    if rng.random() < 0.5 and type(fields) is dict:
        with contextlib.suppress(TypeError):
            allowed.add((username, code, *map(fields.get, names)))
    frozen = frozenset(allowed) if rng.random() < 0.3 else allowed
    case = (frozen, username, code, fields, names)
    same("known_key", case, _outcome(known_key_py, *case), _outcome(checks.known_key, *case))
    return True
