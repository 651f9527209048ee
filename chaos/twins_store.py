"""The store's read-back in `chaos.twins`: `read_stored` (`broker.store._records`, twin
`broker.store.record.read_stored_py`) over commit-log files of usual records, records with one
field of another type, payloads mutated and re-sealed with a valid CRC (so the decoder, not the CRC
check, meets them), damaged headers and zero tails. The drawers (`value`, `text`, `integer`),
`mutate` and the comparison (`same`, which raises `chaos.twins.Divergence`) are `chaos.twins`'s."""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from broker.store.record import read_stored_py

Draw = Callable[[random.Random], Any]
Same = Callable[[str, Any, Any, Any], None]
_HEADER = struct.Struct(">II")


def _outcome(function: Callable[..., Any], *args: Any) -> Any:
    try:
        return "ok", function(*args)
    except Exception as exc:
        return "error", type(exc), str(exc)


def _payload(rng: random.Random, value: Draw, text: Draw, integer: Draw,
             mutate: Callable[[random.Random, bytes], bytes]) -> bytes:
    fields: list[Any] = ["topic", rng.randrange(8), rng.randrange(1 << 40), rng.randrange(1 << 50), 0, 0,
                         1_700_000_000_000, "127.0.0.1:5000", 1_700_000_000_001, "127.0.0.1:10911", 0,
                         {"UNIQ_KEY": "K" * rng.randint(0, 40), "TAGS": rng.choice(["A", "é", ""])},
                         rng.randbytes(rng.choice([0, 10, 200, 70_000]))]
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        index = rng.randrange(len(fields))
        fields[index] = rng.choice([integer(rng), text(rng), value(rng), {text(rng): text(rng)}, None])
    if rng.random() < 0.03:
        fields = fields[:rng.randrange(len(fields))] if rng.random() < 0.5 else [*fields, 1]
    try:
        payload: bytes = msgpack.packb(fields, use_bin_type=True)
    except (ValueError, TypeError, OverflowError):
        payload = msgpack.packb(["topic"])
    if rng.random() < 0.15:
        payload = mutate(rng, payload) or b"\xc0"
    return payload


def check_read_stored(rng: random.Random, records: Any, value: Draw, text: Draw, integer: Draw,
                      mutate: Callable[[random.Random, bytes], bytes], same: Same) -> bool:
    """A file of a few records (each sealed with its payload's CRC, then sometimes damaged), read
    from a random start with a random limit and count by both."""
    out = bytearray(rng.randbytes(3) if rng.random() < 0.1 else b"")
    for _ in range(rng.randint(0, 5)):
        payload = _payload(rng, value, text, integer, mutate)
        record = bytearray(_HEADER.pack(len(payload) + _HEADER.size, zlib.crc32(payload)) + payload)
        if rng.random() < 0.05:                 # a damaged header: size or CRC
            record[rng.randrange(8)] ^= 1 << rng.randrange(8)
        out += record
    out += bytes(rng.choice([0, 0, 4, 8, 40]))
    size = len(out)
    relative = 0 if rng.random() < 0.8 else rng.choice([3, rng.randint(0, size), -1])
    limit = size if rng.random() < 0.8 else rng.choice([rng.randint(0, size), size + 1])
    args = (out if rng.random() < 0.8 else bytes(out), relative, limit, rng.choice([0, 1 << 40]),
            100 if rng.random() < 0.8 else rng.choice([0, 1, 2]))
    same("read_stored", args, _outcome(read_stored_py, *args), _outcome(records.read_stored, *args, zlib.crc32))
    return True
