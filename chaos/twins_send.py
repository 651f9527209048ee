"""The single send's fast path in `chaos.twins`: `usual_send` and `send_response` (`protocol._speedups`,
twins `usual_send_py` and `send_response_py` of `broker.processors.usual_send`) on random ext maps,
bodies and response fields, and `write_record`
(`broker.store._records`, twin `broker.store.record.write_record_py`) writing one record into a
buffer, compared byte for byte with the bytes around it. The value drawers (`value`, `text`,
`integer`) and the comparison (`same`, which raises `chaos.twins.Divergence`) are `chaos.twins`'s."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Any

from broker.processors.usual_send import send_response_py, usual_send_py
from broker.store.record import write_record_py

Draw = Callable[[random.Random], Any]
Same = Callable[[str, Any, Any, Any], None]


def _outcome(function: Callable[..., Any], *args: Any) -> Any:
    try:
        return "ok", function(*args)
    except Exception as exc:
        return "error", type(exc), str(exc)


def check_usual_send(rng: random.Random, speedups: Any, value: Draw, text: Draw, integer: Draw, same: Same) -> bool:
    """Mostly usual sends with one field or property changed, some maps of random values."""
    properties: Any = {"UNIQ_KEY": "K" * rng.randint(0, 40), "TAGS": rng.choice(["A", "é", text(rng)])}
    for _ in range(rng.choice([0, 0, 1, 2])):
        properties[rng.choice(["DELAY", "DEDUP", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC",
                               "TRAN_MSG", "KEYS", text(rng)])] = rng.choice([text(rng), "1", value(rng)])
    fields: Any = {"topic": "orders", "queue_id": rng.randrange(8), "producer_group": "pg", "flag": 0,
                   "born_timestamp": 1_700_000_000_000, "reconsume_times": 0, "properties": properties}
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        key = rng.choice([*fields, "max_reconsume_times", text(rng)])
        if rng.random() < 0.2:
            fields.pop(key, None)
        else:
            fields[key] = rng.choice([integer(rng), value(rng), None, True])
    if rng.random() < 0.05:
        fields = value(rng)
    body = rng.randbytes(rng.randint(0, 400)) if rng.random() < 0.9 else value(rng)
    max_properties_bytes = rng.choice([0, 200, 32_767, 32_767, 32_767])
    max_message_bytes = rng.choice([100, 500, 1 << 22, 1 << 22, 1 << 22])
    case = (fields, body, max_properties_bytes, max_message_bytes)
    same("usual_send", case, _outcome(usual_send_py, *case), _outcome(speedups.usual_send, *case))
    return True


def check_send_response(rng: random.Random, speedups: Any, value: Draw, text: Draw, integer: Draw,
                        same: Same) -> bool:
    """The response of a stored send: usual values mostly, any value in any field sometimes."""
    def field(usual: Any, unusual: Draw) -> Any:
        return unusual(rng) if rng.random() < 0.15 else usual
    case = (field(rng.randrange(1 << 31), integer), field("7F00000100002A9F", text),
            field(rng.randrange(1 << 64) if rng.random() < 0.5 else rng.randrange(1 << 30), integer),
            field(rng.randrange(8), value), field(rng.randrange(1 << 40), value))
    c = _outcome(speedups.send_response, *case)
    if c == ("ok", None):                     # left to the twin
        return False
    same("send_response", case, _outcome(send_response_py, *case), c)
    return True


def check_write_record(rng: random.Random, records: Any, value: Draw, text: Draw, integer: Draw, same: Same) -> bool:
    """One record written into a buffer by both; where C leaves the case to the twin (None) it
    must have written nothing."""
    def field(usual: Any, unusual: Draw) -> Any:
        return unusual(rng) if rng.random() < 0.1 else usual
    head: Any = (field("topic", text), field(3, integer), field(0, integer), field(1_700_000_000_000, integer),
                 field("10.0.0.1:5", text), field(1_700_000_000_001, integer), "127.0.0.1:10911", field(0, integer))
    if rng.random() < 0.03:
        head = head[:7]
    properties: Any = {text(rng): text(rng) for _ in range(rng.randint(0, 3))}
    if rng.random() < 0.05:
        properties = {1: "x"}
    message: Any = (properties, field(0, integer), field(rng.randbytes(rng.randint(0, 1_500)), value))
    if rng.random() < 0.05:
        message = list(message) if rng.random() < 0.5 else message[:2]
    size = rng.choice([0, 50, 300, 2_000, 70_000])
    relative = rng.choice([-1, 0, 7, 100, size // 2, size])
    limit = rng.choice([relative, relative + 60, relative + 400, size, size + 1])
    queue_offset, commit_log_offset = field(5, integer), field(2**40, integer)
    by_c, by_python = bytearray(b"\xee" * size), bytearray(b"\xee" * size)
    case = (size, relative, limit, head, queue_offset, commit_log_offset, message)
    c = _outcome(records.write_record, by_c, relative, limit, head, queue_offset, commit_log_offset, message,
                 zlib.crc32)
    if c == ("ok", None):                     # the twin's case: nothing may have been written
        same("write_record", case, bytes(by_python), bytes(by_c))
        return False
    python = _outcome(write_record_py, by_python, relative, limit, head, queue_offset, commit_log_offset, message)
    same("write_record", case, (python, by_python), (c, by_c))
    return True
