"""The store's checks in `chaos.twins`: the key index's ring (`KeyRing`, twin
`broker.store.key_index.KeyRingPy`), driven by random calls, every answer compared; and its
read-back: `read_stored` (`broker.store._records`, twin `broker.store.record.read_stored_py`) over
commit-log files of usual records, records with one field of another type, payloads mutated and
re-sealed with a valid CRC (so the decoder, not the CRC check, meets them), damaged headers and
zero tails. The drawers (`value`, `text`, `integer`), `mutate` and the comparison (`same`, which
raises `chaos.twins.Divergence`) are `chaos.twins`'s."""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from broker.store.key_index import KeyRingPy
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


def check_key_ring(rng: random.Random, records: Any, same: Same) -> bool:
    """Both rings (`KeyRing`, twin `KeyRingPy`) of one small capacity driven by the same calls, as
    `KeyIndex` drives them (a message `add_run` leaves goes through `add`, a bad value raises),
    every answer compared (an exception by its type: the messages differ)."""
    count = rng.randint(0, 6)
    words = "".join(rng.choice(["a", "k", "kk", " ", "\t", "\u00a0", "\u3000", "é"]) for _ in range(rng.randint(0, 8)))
    kinds: list[Any] = [{"UNIQ_KEY": ""}, {"UNIQ_KEY": "a", "KEYS": "k"}, {}, {"UNIQ_KEY": 5}, {"KEYS": 5},
                        {"TAGS": "x", "UNIQ_KEY": "d"}, {"KEYS": words}, {"KEYS": words, "UNIQ_KEY": "a"},
                        {"KEYS": "a a k", "UNIQ_KEY": ""}, ["UNIQ_KEY"]]
    calls: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(1, 12)):
        properties = [rng.choice([{"UNIQ_KEY": rng.choice(["a", "b", "c"])}, *kinds]) for _ in range(count)]
        units = [(rng.choice([rng.randrange(1 << 50), rng.randrange(1 << 70), -1, True]), 1, 0)
                 for _ in range(rng.randint(max(0, count - 1), count + 1))]
        stored_ms = rng.choice([0, -5, 12_345, (1 << 63) - 1, 1 << 63])
        calls.append(rng.choice([
            ("add_run", rng.choice(["t#", "u#"]), properties, units, rng.randint(-2, 3), stored_ms),
            ("add", "t#", rng.choice(["a", "k", "kk", "é", ""]), rng.choice([0, 7, (1 << 63) - 1, 1 << 63, -1]),
             stored_ms),
            ("query", rng.choice(["t#", "u#"]), rng.choice(["a", "b", "c", "d", "k", "kk", "é"]),
             rng.randint(-1, 5), rng.choice([0, 12_345, -5]), rng.choice([0, 12_345, -1]))]))
    capacity = rng.randint(0, 5)

    def run(make: Callable[[int], Any]) -> Any:
        ring = make(capacity)
        answers = []
        for name, *args in calls:
            answer = _outcome(getattr(ring, name), *args)
            answers.append(answer[:2] if answer[0] == "error" else answer)
            answers.append(len(ring))
        return answers
    same("KeyRing", (capacity, calls), run(KeyRingPy), run(records.KeyRing))
    return True


class _Channel:
    def __init__(self, remote_address: Any) -> None:
        self.remote_address = remote_address


def check_trace_sets(rng: random.Random, sets: Any, same: Same) -> bool:
    """The trace recorder's per-message calls (`SetsBase`, twin `broker.trace.sets.SetsBasePy`), each
    the base of a recorder with the same small bound, driven by the same calls (odd values too:
    None, floats, unhashable names); every recorder state compared after each call with the times
    replaced (each taken during the run), an exception by its type."""
    from broker.trace.recorder import TraceRecorder
    from broker.trace.sets import SetsBasePy

    if not issubclass(TraceRecorder, sets.SetsBase):
        raise RuntimeError("TraceRecorder does not derive from broker.trace._sets.SetsBase")

    class Twin(TraceRecorder):
        sent_usual = SetsBasePy.sent_usual
        pulled = SetsBasePy.pulled
        committed = SetsBasePy.committed

    names = ["g", "h", "", None, ["unhashable"]]
    offsets = [0, 1, 5, -1, None, 2.5, 1 << 70]
    calls: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(1, 30)):
        pick = rng.random()
        if pick < 0.35:
            calls.append(("sent_usual", rng.choice(["c", "d"]), rng.choice(names), "t", rng.randint(0, 1),
                          rng.choice(offsets)))
        elif pick < 0.6:
            calls.append(("pulled", _Channel(rng.choice(["c", "d", None])), rng.choice(names), "t", 0,
                          rng.choice(offsets), rng.choice(offsets), rng.randint(0, 3)))
        elif pick < 0.9:
            calls.append(("committed", rng.choice(["c", "d"]), rng.choice(names), "t", rng.randint(0, 1),
                          rng.choice(offsets), rng.choice(offsets)))
        else:
            calls.append(("drain",))
    max_events = rng.randint(0, 6)

    def run(make: Any) -> Any:
        recorder = make(max_events)
        answers = []
        for name, *args in calls:
            answer = _outcome(getattr(recorder, name), *args)
            if answer[0] == "error":
                answers.append(answer[:2])
            answers.append(_timeless((list(recorder._queue), recorder._sent_sets, recorder._pulled_sets,
                                      recorder._commits, recorder._in_sets, recorder.dropped)))
        return answers
    same("trace_sets", (max_events, calls), run(Twin), run(TraceRecorder))
    return True


def _timeless(value: Any) -> Any:
    """`value` with every float replaced by "t" (the times the calls took), as a repr."""
    if isinstance(value, float):
        return "t"
    if isinstance(value, (list, tuple)):
        return [_timeless(item) for item in value]
    if isinstance(value, dict):
        return [(_timeless(key), _timeless(item)) for key, item in value.items()]
    return repr(value)
