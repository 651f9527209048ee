"""Request signatures: the canonical form both sides compute, HMAC-SHA256 signing and checking.

Every request a client sends while it has credentials carries four `ext` fields:

| field | type | meaning |
|---|---|---|
| `auth_access_key` | str | the user name |
| `auth_timestamp_ms` | int | the signer's clock, epoch ms |
| `auth_nonce` | str | 32 lower-case hex digits, random, never reused |
| `auth_signature` | str | 64 lower-case hex digits: HMAC-SHA256(signing key, canonical bytes) |

The canonical bytes are one msgpack array, packed with the shortest encodings (as msgpack-python
packs by default; floats as float 64, strings as str, bytes as bin):

    ["RQ1-HMAC-SHA256", code, ext, sha256(body)]

where `code` is the request code (int), `ext` is the request's `ext` map without
`auth_signature` (so the access key, timestamp and nonce are signed) with the keys of every map,
at every depth, sorted by code point (the order of their UTF-8 bytes), and `sha256(body)` is the
32-byte digest of the body as bin. The opaque, flag and remark are not signed (the opaque is
chosen per connection; a one-way request and a request with a response differ only in the flag).

The signing key is not the password: `signing_key(access_key, secret_key)` derives it with
PBKDF2-HMAC-SHA256 (salt `"rocketq-user:" + access_key`, 10,000 iterations, 32 bytes), so a broker
and a name server store the derived key, never the password (a thief of the stored key can sign
requests as that user, as with any shared-secret scheme, but cannot log in elsewhere with the
password). Differs from RocketMQ's ACL 2.0 (HMAC-SHA1 over the sorted ext fields, no nonce): the
body digest, the nonce and the timestamp make a captured frame useless to replay."""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from protocol import native
from protocol.command import Buffer, RemotingCommand

SCHEME = "RQ1-HMAC-SHA256"
ACCESS_KEY = "auth_access_key"
TIMESTAMP = "auth_timestamp_ms"
NONCE = "auth_nonce"
SIGNATURE = "auth_signature"
AUTH_FIELDS = (ACCESS_KEY, TIMESTAMP, NONCE, SIGNATURE)
KDF_ITERATIONS = 10_000
KEY_BYTES = 32


def signing_key(access_key: str, secret_key: str) -> bytes:
    """The 32-byte HMAC key of a user (see the module docstring); ~5 ms, so compute it once."""
    return hashlib.pbkdf2_hmac("sha256", secret_key.encode(), ("rocketq-user:" + access_key).encode(),
                               KDF_ITERATIONS, KEY_BYTES)


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user's access key (the user name) and secret key (the password), as clients take them:
    `Producer(..., credentials=Credentials("billing", "s3cret"))`. `key` is the derived signing
    key, computed once here."""

    access_key: str
    secret_key: str = field(repr=False)
    key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.access_key:
            raise ValueError("credentials need an access key (the user name)")
        object.__setattr__(self, "key", signing_key(self.access_key, self.secret_key))


# One msgpack Packer per thread (`packb` builds one per call: ~0.6 µs of every signature); a
# Packer is not safe to share between threads, and signing runs on any thread with a loop.
_PACKERS = threading.local()
_SPEEDUPS = native.speedups()
_c_canonical_bytes = getattr(_SPEEDUPS, "canonical_bytes", None)
# The whole of `sign` and `verify` in C, with the SHA-256 of the libcrypto hashlib uses (None:
# not built, or no libcrypto found: the twins `sign_py` and `verify_py` run).
_c_sign_fields: Callable[..., bool] | None = None
_c_signature_matches: Callable[..., bool | None] | None = None
# `protocol._speedups.check_signed(code, fields, body, users)`, the start of a server's check in C
# (auth/authenticate.py uses it), or None.
c_check_signed: Callable[..., Any] | None = None
if _SPEEDUPS is not None and hasattr(_SPEEDUPS, "configure_signing") and _SPEEDUPS.configure_signing(
        SCHEME, ACCESS_KEY, TIMESTAMP, NONCE, SIGNATURE):
    _c_sign_fields, _c_signature_matches = _SPEEDUPS.sign_fields, _SPEEDUPS.signature_matches
    c_check_signed = _SPEEDUPS.check_signed
_SCALARS = frozenset({str, int, bool, float, bytes, type(None)})    # packed as they are, nothing to sort


def _sorted(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:        # (exact types first: an ABC isinstance check costs ~0.5 µs a value)
        return value
    if kind is dict or isinstance(value, Mapping):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if kind is list or kind is tuple or isinstance(value, list | tuple):
        return [_sorted(v) for v in value]
    return value


def _digest(body: Buffer | Iterable[Buffer]) -> bytes:
    if isinstance(body, bytes | bytearray | memoryview):
        return hashlib.sha256(body).digest()
    digest = hashlib.sha256()
    for part in body:
        digest.update(part)
    return digest.digest()


def canonical_bytes(code: int, fields: Mapping[str, Any], body: Buffer | Iterable[Buffer]) -> bytes:
    """The bytes that are signed: see the module docstring. Raises `TypeError` when a map in
    `fields` has keys that cannot be sorted together (the protocol's maps have string keys).
    Packed in C when `protocol._speedups` was built (a third of the time), else by the twin."""
    digest = _digest(body)
    if _c_canonical_bytes is not None:
        packed: bytes | None = _c_canonical_bytes(SCHEME, code, fields, SIGNATURE, digest)
        if packed is not None:
            return packed
    return canonical_bytes_py(code, fields, digest)


def canonical_bytes_py(code: int, fields: Mapping[str, Any], digest: bytes) -> bytes:
    """`canonical_bytes` with the body's digest given, in Python: the reference of
    `protocol._speedups.canonical_bytes`."""
    scalars = _SCALARS
    ext = {}
    for key in sorted(fields):
        value = fields[key]
        ext[key] = value if type(value) in scalars else _sorted(value)
    ext.pop(SIGNATURE, None)
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
    packed: bytes = packer.pack([SCHEME, code, ext, digest])
    return packed


_IPAD = bytes(x ^ 0x36 for x in range(256))     # RFC 2104's pads, as `bytes.translate` tables
_OPAD = bytes(x ^ 0x5C for x in range(256))


@functools.lru_cache(maxsize=1_024)
def _hmac_pads(key: bytes) -> tuple[Any, Any]:
    """SHA-256 states after `key` XOR ipad and XOR opad (RFC 2104): each signature copies them
    instead of starting HMAC over (~1 µs of the ~2 µs hmac.new costs); a key is a user's."""
    block = (key if len(key) <= 64 else hashlib.sha256(key).digest()).ljust(64, b"\0")
    return hashlib.sha256(block.translate(_IPAD)), hashlib.sha256(block.translate(_OPAD))


def signature(key: bytes, code: int, fields: Mapping[str, Any], body: Buffer | Iterable[Buffer]) -> str:
    """HMAC-SHA256 of the canonical bytes under `key`, as 64 lower-case hex digits."""
    inner_pad, outer_pad = _hmac_pads(key)
    inner = inner_pad.copy()
    inner.update(canonical_bytes(code, fields, body))
    outer = outer_pad.copy()
    outer.update(inner.digest())
    digest: str = outer.hexdigest()
    return digest


def sign(cmd: RemotingCommand, credentials: Credentials, *, now_ms: int | None = None,
         nonce: str | None = None) -> None:
    """Add the four auth fields to `cmd.fields` (replacing any there), signed with `credentials`.
    In one C call (`protocol._speedups.sign_fields`: the body's digest, the canonical bytes and the
    HMAC) when it was built, else (or for what it does not take) by `sign_py`."""
    timestamp_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    nonce = os.urandom(16).hex() if nonce is None else nonce
    if _c_sign_fields is not None and _c_sign_fields(cmd.fields, cmd.code, cmd.body, credentials.access_key,
                                                     timestamp_ms, nonce, credentials.key):
        return
    sign_py(cmd, credentials, timestamp_ms, nonce)


def sign_py(cmd: RemotingCommand, credentials: Credentials, timestamp_ms: int, nonce: str) -> None:
    """`sign` in Python: the reference of `protocol._speedups.sign_fields`."""
    fields = cmd.fields
    fields[ACCESS_KEY] = credentials.access_key
    fields[TIMESTAMP] = timestamp_ms
    fields[NONCE] = nonce
    fields.pop(SIGNATURE, None)
    fields[SIGNATURE] = signature(credentials.key, cmd.code, fields, cmd.body)


def signer(credentials: Credentials) -> Callable[[RemotingCommand], None]:
    """A function that signs a request in place (what `Channel.signer` holds). Its nonces count
    up from a random 127-bit start drawn once, in hex (32 digits; 33 only past 2**128): unique
    without a `getrandom` call per request (a nonce must never repeat; it need not be
    unpredictable, the signature covers it). `hex()` rather than a format spec: ~1,500 fewer
    instructions a request."""
    counter = itertools.count(int.from_bytes(os.urandom(16), "big") | 1 << 127)
    access_key, key = credentials.access_key, credentials.key
    c_sign, clock_ns = _c_sign_fields, time.time_ns

    def sign_request(cmd: RemotingCommand) -> None:
        nonce = hex(next(counter))[2:]
        timestamp_ms = clock_ns() // 1_000_000
        if c_sign is None or not c_sign(cmd.fields, cmd.code, cmd.body, access_key, timestamp_ms, nonce, key):
            sign_py(cmd, credentials, timestamp_ms, nonce)
    return sign_request


def verify(cmd: RemotingCommand, key: bytes) -> bool:
    """True when `cmd`'s `auth_signature` is the signature of its code, ext and body under `key`
    (compared in constant time). False for a missing or malformed signature or unsortable maps.
    In one C call (`protocol._speedups.signature_matches`) when it was built, else (or for what
    it does not take) by `verify_py`."""
    if _c_signature_matches is not None:
        matches: bool | None = _c_signature_matches(cmd.code, cmd.fields, cmd.body, key)
        if matches is not None:
            return matches
    return verify_py(cmd, key)


def verify_py(cmd: RemotingCommand, key: bytes) -> bool:
    """`verify` in Python: the reference of `protocol._speedups.signature_matches`."""
    claimed = cmd.fields.get(SIGNATURE)
    if not isinstance(claimed, str) or len(claimed) != 64 or not claimed.isascii():
        return False
    try:
        expected = signature(key, cmd.code, cmd.fields, cmd.body)
    except TypeError:
        return False
    return hmac.compare_digest(expected, claimed)
