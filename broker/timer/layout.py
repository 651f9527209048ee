"""The timer store's on-disk layout and its arithmetic (RocketMQ 5 `TimerLog` / `TimerWheel` /
`Slot`, RIP-43). Pure: bytes and integers in, bytes and integers out.

Timer-log record (32 bytes, little-endian): `prev_pos i64` (the byte position of the previous
record of the same slot, -1 for none), `commit_log_offset i64`, `deliver_ms i64` (the due time,
epoch ms), `size i32` (the record's size in the commit log), `crc u32` (CRC-32 of the first 28
bytes: a torn or stale record is never followed).

Wheel slot (32 bytes): `slot i64` (the absolute slot number `deliver_ms // precision_ms` it holds;
anything else there is a stale slot of an earlier round, read as empty), `head_pos i64` (the
newest record of the slot: its chain runs back through `prev_pos`), `first_pos i64` (the oldest),
`records i32` (the count), 4 bytes of padding. The wheel holds `slots_total` slots, slot `n` at index
`n % slots_total`: `slots_total` is twice the slots of `timer_max_delay_sec`, as RocketMQ's
wheel (`slotsTotal * 2`), so no two live slots share an index while the dequeue is less than
`timer_max_delay_sec` behind."""

from __future__ import annotations

import mmap
import struct
import zlib
from typing import NamedTuple

RECORD = struct.Struct("<qqqi")
RECORD_SIZE = 32
CRC = struct.Struct("<I")
SLOT = struct.Struct("<qqqi4x")
SLOT_SIZE = 32
NO_POS = -1


class TimerRecord(NamedTuple):
    pos: int                 # where it is in the timer log
    prev_pos: int
    commit_log_offset: int
    deliver_ms: int
    size: int


class Slot(NamedTuple):
    head_pos: int            # NO_POS: empty
    first_pos: int
    records: int


EMPTY_SLOT = Slot(NO_POS, NO_POS, 0)


def slot_of(deliver_ms: int, precision_ms: int) -> int:
    """The absolute slot of a due time: `deliver_ms // precision_ms` (RocketMQ rounds the same
    way). The dequeue opens slot `n` at `n * precision_ms` and delivers each of its records when
    its own `deliver_ms` has come, so rounding down never delivers early."""
    return deliver_ms // precision_ms


def slots_total(max_delay_ms: int, precision_ms: int) -> int:
    """Slots in the wheel: twice those of `max_delay_ms` (at least 2)."""
    return max(2, 2 * -(-max_delay_ms // precision_ms))


def slot_index(slot: int, total: int) -> int:
    return slot % total


def encode_record(prev_pos: int, commit_log_offset: int, deliver_ms: int, size: int) -> bytes:
    head = RECORD.pack(prev_pos, commit_log_offset, deliver_ms, size)
    return head + CRC.pack(zlib.crc32(head))


def decode_record(data: bytes | memoryview | mmap.mmap, offset: int, pos: int) -> TimerRecord | None:
    """The record at `data[offset:offset + 32]` (at timer-log position `pos`), or None when its CRC
    does not match (torn, never written, or not a record)."""
    prev_pos, commit_log_offset, deliver_ms, size = RECORD.unpack_from(data, offset)
    (crc,) = CRC.unpack_from(data, offset + 28)
    if crc != zlib.crc32(data[offset:offset + 28]) or prev_pos >= pos or size <= 0:
        return None
    return TimerRecord(pos, prev_pos, commit_log_offset, deliver_ms, size)


def encode_slot(slot: int, value: Slot) -> bytes:
    return SLOT.pack(slot, value.head_pos, value.first_pos, value.records)


def decode_slot(data: bytes | memoryview | mmap.mmap, offset: int, slot: int) -> Slot:
    """Slot `slot` as stored at `data[offset:offset + 32]`; `EMPTY_SLOT` when the stored slot
    number is another (a slot of another round, or never written)."""
    stored, head_pos, first_pos, count = SLOT.unpack_from(data, offset)
    if stored != slot or head_pos < 0:
        return EMPTY_SLOT
    return Slot(head_pos, first_pos, count)


def link(slot: Slot, pos: int) -> Slot:
    """The slot after appending the record at `pos` (whose `prev_pos` is `slot.head_pos`)."""
    return Slot(pos, slot.first_pos if slot.records else pos, slot.records + 1)
