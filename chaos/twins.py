"""`python -m chaos.twins [--seconds S | --cases N] [--seed N] [--only NAME]` (`make fuzz-twins`): every
function of rocketq's optional C modules against its pure-Python twin, on random and mutated input.

The C functions promise their twin's result for every input, and for a bad one the same exception
type and message (or, for the encoders and the store's helpers, `None` / `False`: "not the usual
case, let the twin do it"). The property tests check that on hypothesis's examples; this draws
about two million a minute (a quarter of that under the sanitizers), from well-formed values cut,
flipped, spliced and repeated, and stops at the first input where the two differ, printing it.
Run inside `python -m chaos.sanitize` (`make sanitize`), the same inputs go through the C code
built with AddressSanitizer and UBSan.

Functions: `decode_frames`, `frame_bytes`, `decode_message_batch`, `read_batch_body` (through
`decode_batch`), `offset_msg_ids`, and `canonical_bytes`, `sign_fields`, `signature_matches`,
`check_signed` (`chaos.twins_signing`), `usual_send`, `send_response` (`chaos.twins_send`)
(`protocol._speedups`); `encode_run`, `write_record` (`chaos.twins_send`), `write_units`,
`KeyRing`, `read_stored` (both `chaos.twins_store`) (`broker.store._records`); `NonceCache`,
`known_key` (`chaos.twins_signing`) (`auth._checks`); `SetsBase` (`chaos.twins_store`)
(`broker.trace._sets`). Exits 1 on a
difference, or when the process's RSS grew more than `--max-rss-growth-mb` after the first tenth of
the run (a reference leaked on some path; not checked under a sanitizer, whose allocator keeps
freed memory), 2 when the C modules were not built."""

from __future__ import annotations

import argparse
import enum
import gc
import os
import random
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import msgpack
import psutil

from broker.processors.send_message import decode_batch, decode_batch_py
from broker.store.consume_queue import write_units_py
from broker.store.record import encode_run_py
from chaos.fuzz import mutated_frame, random_frame
from chaos.twins_send import check_send_response, check_usual_send, check_write_record
from chaos.twins_signing import (
    check_canonical_bytes,
    check_check_signed,
    check_known_key,
    check_nonce_cache,
    check_sign_fields,
    check_signature_matches,
)
from chaos.twins_store import check_key_ring, check_read_stored, check_trace_sets
from protocol import frame, native
from protocol.command import RemotingCommand
from protocol.errors import MessageIllegal
from protocol.message import decode_message_batch_py, encode_stored_message, offset_msg_ids_py

INTS = [0, 1, -1, 31, 127, 128, 255, 256, 65_535, 65_536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
        2**64 - 1, 2**64, -(2**31), -(2**31) - 1, -(2**63), -(2**63) - 1, -32, -33, -128, -129]
TEXTS = ["", "t", "é", "日本", "\ud800", "a" * 31, "b" * 32, "c" * 255, "d" * 256, "e" * 65_536]


class Divergence(AssertionError):
    """The C function and its twin disagreed on `case` (`python` and `c`: what each gave)."""

    def __init__(self, function: str, case: Any, python: Any, c: Any) -> None:
        super().__init__(f"{function}: C and Python differ\n  input:  {case!r:.2000}\n  python: {python!r:.2000}\n"
                         f"  c:      {c!r:.2000}")
        self.function, self.case, self.python, self.c = function, case, python, c


class _Code(enum.IntEnum):
    SEND_MESSAGE = 10


def outcome(function: Callable[..., Any], *args: Any) -> Any:
    """("ok", result) or ("error", exception type, message)."""
    try:
        return "ok", function(*args)
    except Exception as exc:
        return "error", type(exc), str(exc)


def _same(function: str, case: Any, python: Any, c: Any) -> None:
    if python != c and repr(python) != repr(c):        # (repr: a NaN decoded by both is not == itself)
        raise Divergence(function, case, python, c)


def mutate(rng: random.Random, data: bytes) -> bytes:
    """`data` with one to four edits: a byte set to a msgpack tag or random, cut short, random bytes
    inserted, bytes deleted, a stretch repeated."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.4 and out:
            out[rng.randrange(len(out))] = rng.choice([0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9D, 0xC0, 0xC1, 0xC4, 0xC6,
                                                       0xCE, 0xCF, 0xD3, 0xD9, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xFF,
                                                       rng.randrange(256)])
        elif kind < 0.55 and out:
            del out[rng.randrange(len(out)):]
        elif kind < 0.7:
            at = rng.randrange(len(out) + 1)
            out[at:at] = rng.randbytes(rng.randint(1, 6))
        elif kind < 0.85 and out:
            at = rng.randrange(len(out))
            del out[at:at + rng.randint(1, 6)]
        elif out:
            at = rng.randrange(len(out))
            out[at:at] = out[at:at + rng.randint(1, 40)]
    return bytes(out)


def _int(rng: random.Random) -> int:
    return rng.choice(INTS) if rng.random() < 0.8 else rng.randrange(-(2**70), 2**70)


def _text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(TEXTS)
    return "".join(rng.choice("ab_%#é\x00") for _ in range(rng.randint(0, 8)))


def _encodable_text(rng: random.Random) -> str:
    text = _text(rng)
    return text if text != "\ud800" else "s"


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.random()
    if depth > 2 or kind < 0.5:
        return rng.choice([_int(rng), _text(rng), None, True, 1.5, float("nan"), rng.randbytes(rng.randint(0, 40))])
    if kind < 0.75:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_text(rng): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


# -- protocol._speedups ----------------------------------------------------------------------------

def frames_outcome(buffer: bytes, max_frame_bytes: int, decode: Callable[..., Any], max_commands: int = 0) -> Any:
    """(commands as comparable tuples, consumed) or (error type, message, opaque, cause is None,
    context suppressed): what `decode_frames` (either twin) makes of `buffer`. Fields are compared
    by their repr, so a NaN decoded by both twins compares equal (NaN != NaN)."""
    try:
        commands, consumed = decode(buffer, max_frame_bytes, max_commands)
    except Exception as exc:
        return (type(exc), str(exc), getattr(exc, "opaque", None), exc.__cause__ is None, exc.__suppress_context__)
    return [(c.code, c.opaque, c.flag, c.remark, repr(c.fields), c.body, c.version) for c in commands], consumed


def check_decode_frames(rng: random.Random, speedups: Any) -> bool:
    wire = b"".join(random_frame(rng) if rng.random() < 0.8 else mutated_frame(rng) for _ in range(rng.randint(1, 3)))
    buffer = mutate(rng, wire) if rng.random() < 0.7 else wire
    case = (buffer, rng.choice([16, 256, 1 << 20]), rng.choice([0, 0, 1, 2, -1]))   # (.., max_frame, max_commands)
    _same("decode_frames", case, frames_outcome(case[0], case[1], frame.decode_frames_py, case[2]),
          frames_outcome(case[0], case[1], speedups.decode_frames, case[2]))
    return True


def _body(rng: random.Random) -> Any:
    raw = rng.randbytes(rng.randint(0, 600))
    kind = rng.randrange(8)
    if kind < 3:
        return raw
    if kind == 3:
        return bytearray(raw)
    if kind == 4:
        return memoryview(raw)
    if kind == 5:
        return [rng.randbytes(rng.randint(0, 100)) for _ in range(rng.randint(0, 4))]
    if kind == 6:
        return (b"a", bytearray(b"b"), memoryview(b"c"))
    return _value(rng)


def check_frame_bytes(rng: random.Random, speedups: Any) -> bool:
    usual = rng.random() < 0.7
    command = RemotingCommand(
        code=rng.choice([_Code.SEND_MESSAGE, 0, 11, 2**16]) if usual else _int(rng),
        opaque=rng.randrange(1 << 32) if usual else _int(rng),
        flag=rng.choice([0, 1, 2, 3]) if usual else _value(rng),
        remark=rng.choice([None, "", "ok", _text(rng)]) if usual else _value(rng),
        fields={_text(rng): _value(rng) for _ in range(rng.randint(0, 4))} if usual else _value(rng),
        body=_body(rng))
    if rng.random() < 0.3:
        command.version = _int(rng)
    max_body_bytes = rng.choice([0, 10, 300, 1 << 20])
    c = outcome(speedups.frame_bytes, command, max_body_bytes)
    if c == ("ok", None):                     # not the usual frame: the Python encoder's
        return False
    python = outcome(lambda: b"".join(bytes(part) for part in frame.encode_frame_py(command)))
    _same("frame_bytes", (command, max_body_bytes), python, c)
    return True


def _stored(rng: random.Random) -> bytes:
    properties = {_encodable_text(rng): _encodable_text(rng) for _ in range(rng.randint(0, 3))}
    return encode_stored_message(
        topic=rng.choice(["t", "topic-a", _encodable_text(rng)]), queue_id=rng.randrange(8),
        queue_offset=rng.randrange(1 << 40), commit_log_offset=rng.choice([0, 1 << 40, 2**64 - 1]),
        flag=rng.randrange(4), sys_flag=0, born_timestamp=1_700_000_000_000, born_host="10.0.0.1:5",
        store_timestamp=1_700_000_000_001, store_host=rng.choice(["1.2.3.4:10911", "127.0.0.1:1"]),
        reconsume_times=rng.randrange(3), properties=properties, body=rng.randbytes(rng.randint(0, 80)))


def check_decode_message_batch(rng: random.Random, speedups: Any) -> bool:
    body = b"".join(_stored(rng) for _ in range(rng.randint(0, 3)))
    if rng.random() < 0.8:
        body = mutate(rng, body)
    _same("decode_message_batch", body, outcome(decode_message_batch_py, body),
          outcome(speedups.decode_message_batch, body))
    return True


def check_read_batch_body(rng: random.Random, speedups: Any) -> bool:
    items: list[Any] = []
    for _ in range(rng.randint(0, 5)):
        if rng.random() < 0.8:
            properties = rng.choice([{}, {"UNIQ_KEY": "u1"}, {"TAGS": "a", "KEYS": "k"}, {"DELAY": "3"},
                                     {_text(rng): _text(rng)}])
            items.append([properties, rng.choice([0, 1, _int(rng)]), rng.randbytes(rng.choice([0, 3, 70]))])
        else:
            items.append(_value(rng))
    try:
        raw: bytes = msgpack.packb(items, use_bin_type=True)
    except (ValueError, TypeError, OverflowError):      # (an int past 64 bits, a lone surrogate)
        return False
    raw = mutate(rng, raw) if rng.random() < 0.6 else raw
    limits = (rng.choice([0, 64, 1 << 20]), rng.choice([0, 8, 40, 32_767]))   # message, properties bytes

    def checked(decode: Callable[[bytes, int, int], Any]) -> Any:
        try:
            return decode(raw, *limits)
        except MessageIllegal as exc:
            return MessageIllegal, str(exc)
    _same("read_batch_body", (raw, *limits), checked(decode_batch_py), checked(decode_batch))
    return True


def check_offset_msg_ids(rng: random.Random, speedups: Any) -> bool:
    prefix = rng.choice(["0" * 16, "7F0000010000277F", "x", "é" * 16, ""])
    offsets: list[Any] = ([rng.randrange(1 << 64) for _ in range(rng.randint(0, 32))] if rng.random() < 0.7
                          else [_value(rng) for _ in range(rng.randint(0, 4))])
    c = outcome(speedups.offset_msg_ids, prefix, offsets)
    if c == ("ok", None):
        return False
    _same("offset_msg_ids", (prefix, offsets), outcome(offset_msg_ids_py, prefix, offsets), c)
    return True


# -- broker.store._records -------------------------------------------------------------------------

def check_encode_run(rng: random.Random, records: Any) -> bool:
    def field(usual: Any, unusual: Callable[[], Any]) -> Any:
        return unusual() if rng.random() < 0.1 else usual
    head = (field("topic", lambda: _text(rng)), field(3, lambda: _int(rng)), field(0, lambda: _int(rng)),
            field(1_700_000_000_000, lambda: _int(rng)), field("10.0.0.1:5", lambda: _text(rng)),
            field(1_700_000_000_001, lambda: _int(rng)), "127.0.0.1:10911", field(0, lambda: _int(rng)))
    messages: list[Any] = []
    for _ in range(rng.randint(0, 6)):
        properties: Any = {_text(rng): _text(rng) for _ in range(rng.randint(0, 3))}
        if rng.random() < 0.05:
            properties = {1: "x"}
        body = field(rng.randbytes(rng.randint(0, 300)), lambda: _value(rng))
        message = (properties, field(0, lambda: _int(rng)), body)
        messages.append(list(message) if rng.random() < 0.1 else message)
    start, first_queue_offset = rng.randint(-1, 3), rng.choice([0, 5, 2**40])
    position = rng.choice([0, 100, 2**40])
    limit = position + rng.choice([0, 50, 200, 1_000, 1 << 20])
    args = (head, messages, start, first_queue_offset, position, limit)
    c = outcome(records.encode_run, *args, zlib.crc32)
    if c == ("ok", None):                     # not the usual run: the Python encoder's
        return False
    _same("encode_run", args, outcome(encode_run_py, *args), c)
    return True


def check_write_units(rng: random.Random, records: Any) -> bool:
    units: list[Any] = [(rng.randrange(1 << 40), rng.randrange(1_000), rng.randint(-5, 5)) if rng.random() < 0.7
                        else tuple(_int(rng) for _ in range(rng.choice([3, 3, 2]))) for _ in range(rng.randint(0, 5))]
    size, position = rng.choice([0, 19, 20, 60, 100, 200]), rng.choice([-1, 0, 5, 20, 180, 199, 300])
    by_c, by_python = bytearray(b"\xee" * size), bytearray(b"\xee" * size)
    c = outcome(records.write_units, by_c, position, units)
    if c == ("ok", False):                    # left to the twin (and struct's errors)
        if by_c != by_python:
            raise Divergence("write_units", (size, position, units), "nothing written", bytes(by_c))
        return False
    _same("write_units", (size, position, units), (outcome(write_units_py, by_python, position, units), by_python),
          (c, by_c))
    return True


CHECKS: dict[str, tuple[str, Callable[[random.Random, Any], bool]]] = {
    "decode_frames": ("protocol._speedups", check_decode_frames),
    "frame_bytes": ("protocol._speedups", check_frame_bytes),
    "decode_message_batch": ("protocol._speedups", check_decode_message_batch),
    "read_batch_body": ("protocol._speedups", check_read_batch_body),
    "offset_msg_ids": ("protocol._speedups", check_offset_msg_ids),
    "canonical_bytes": ("protocol._speedups", lambda rng, c: check_canonical_bytes(rng, c, _value, _text, _same)),
    "sign_fields": ("protocol._speedups", lambda rng, c: check_sign_fields(rng, c, _value, _text, _same, _body)),
    "signature_matches": ("protocol._speedups",
                          lambda rng, c: check_signature_matches(rng, c, _value, _text, _same, _body)),
    "check_signed": ("protocol._speedups", lambda rng, c: check_check_signed(rng, c, _value, _text, _same, _body)),
    "encode_run": ("broker.store._records", check_encode_run),
    "usual_send": ("protocol._speedups", lambda rng, c: check_usual_send(rng, c, _value, _text, _int, _same)),
    "send_response": ("protocol._speedups", lambda rng, c: check_send_response(rng, c, _value, _text, _int, _same)),
    "write_record": ("broker.store._records", lambda rng, c: check_write_record(rng, c, _value, _text, _int, _same)),
    "write_units": ("broker.store._records", check_write_units),
    "key_ring": ("broker.store._records", lambda rng, c: check_key_ring(rng, c, _same)),
    "read_stored": ("broker.store._records",
                    lambda rng, c: check_read_stored(rng, c, _value, _text, _int, mutate, _same)),
    "nonce_cache": ("auth._checks", lambda rng, c: check_nonce_cache(rng, c, _same)),
    "known_key": ("auth._checks", lambda rng, c: check_known_key(rng, c, _value, _text, _same)),
    "trace_sets": ("broker.trace._sets", lambda rng, c: check_trace_sets(rng, c, _same)),
}


def c_modules() -> dict[str, Any]:
    """The built C modules by name (`protocol._speedups` configured by importing its users); none
    under RQ_PURE_PYTHON."""
    modules = {"protocol._speedups": native.speedups(), "broker.store._records": native.load("broker.store._records"),
               "auth._checks": native.load("auth._checks"), "broker.trace._sets": native.load("broker.trace._sets")}
    return {name: module for name, module in modules.items() if module is not None}


def run(seed: int, *, cases: int | None = None, seconds: float | None = None,
        only: list[str] | None = None, on_progress: Callable[[float], None] | None = None) -> dict[str, list[int]]:
    """Draw cases round-robin over the checks (`only`: these) until `cases` were drawn or
    `seconds` passed; returns {function: [drawn, compared]} ("compared": the C function took the
    case rather than handing it to its twin). Raises `Divergence` at the first difference,
    `RuntimeError` when a module the checks need was not built. `on_progress(fraction_done)` is
    called every 1,000 cases."""
    if (cases is None) == (seconds is None):
        raise ValueError("give either cases or seconds")
    modules = c_modules()
    names = only or list(CHECKS)
    missing = sorted({CHECKS[name][0] for name in names} - set(modules))
    if missing:
        raise RuntimeError(f"not built (or RQ_PURE_PYTHON is set): {', '.join(missing)}")
    rng = random.Random(seed)
    counts = {name: [0, 0] for name in names}
    started, drawn = time.monotonic(), 0
    while True:
        done = drawn / cases if cases is not None else (time.monotonic() - started) / seconds  # type: ignore[operator]
        if done >= 1:
            return counts
        if on_progress is not None and drawn % 1_000 == 0:
            on_progress(done)
        name = names[drawn % len(names)]
        module, check = CHECKS[name]
        counts[name][0] += 1
        counts[name][1] += check(rng, modules[module])
        drawn += 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.twins", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, help="run this long (default 60)")
    budget.add_argument("--cases", type=int, help="draw this many cases instead")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", choices=list(CHECKS), help="this function only (repeatable)")
    parser.add_argument("--max-rss-growth-mb", type=float, default=16.0,
                        help="fail when RSS grew more than this after the first tenth of the run (default 16)")
    args = parser.parse_args()
    seconds = None if args.cases is not None else 60.0 if args.seconds is None else args.seconds
    sanitized = "asan" in os.environ.get("LD_PRELOAD", "")
    marks: list[int] = []

    def progress(done: float) -> None:
        if not marks and done >= 0.1:
            gc.collect()
            marks.append(psutil.Process().memory_info().rss)
    started = time.monotonic()
    try:
        counts = run(args.seed, cases=args.cases, seconds=seconds, only=args.only, on_progress=progress)
    except RuntimeError as exc:
        print(f"chaos.twins: {exc}", file=sys.stderr)
        return 2
    except Divergence as exc:
        print(f"chaos.twins (seed {args.seed}): {exc}", file=sys.stderr)
        return 1
    gc.collect()
    end_rss = psutil.Process().memory_info().rss
    total = sum(drawn for drawn, _ in counts.values())
    print(f"chaos.twins seed {args.seed}: {total:,} cases in {time.monotonic() - started:.0f} s, no difference")
    for name, (drawn, compared) in counts.items():
        print(f"  {name:<22} {drawn:>9,} drawn  {compared:>9,} compared")
    if not marks:
        return 0
    growth_mb = (end_rss - marks[0]) / (1 << 20)
    print(f"  RSS {marks[0] / (1 << 20):.1f} MB after the first tenth, {end_rss / (1 << 20):.1f} MB at the end"
          + (" (not checked under a sanitizer)" if sanitized else ""))
    if not sanitized and growth_mb > args.max_rss_growth_mb:
        print(f"chaos.twins: RSS grew {growth_mb:.1f} MB (> {args.max_rss_growth_mb}): a leak?", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
