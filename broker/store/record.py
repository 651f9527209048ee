"""The on-disk commit-log record, pure: `u32be total_size`, `u32be crc32(payload)`, `payload`.

`total_size` counts the whole record, this 8-byte header included; `payload` is the stored message
exactly as `protocol.message.encode_stored_message` writes it (a 13-field msgpack array), so a pull
answers with stored payloads side by side and decodes nothing. A `total_size` of 0 is never a record:
it is the zero tail of a segment (RocketMQ's BLANK end-of-file record) or the end of data.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack

from protocol.message import F_COMMIT_LOG_OFFSET, F_PROPERTIES, STORED_FIELD_COUNT

RECORD_HEADER = struct.Struct(">II")
HEADER_BYTES = RECORD_HEADER.size
MIN_RECORD_BYTES = HEADER_BYTES + 1     # the smallest msgpack value is one byte
STREAM_PROPERTIES_FROM_BYTES = 16 * 1024


class RecordError(ValueError):
    """Bytes that are not a complete, intact record."""


def encode_record(payload: bytes) -> bytes:
    """Header + `payload`, as written to the commit log."""
    return RECORD_HEADER.pack(len(payload) + HEADER_BYTES, zlib.crc32(payload)) + payload


def record_size_at(buffer: Any, position: int, limit: int) -> int:
    """Total size of the intact record starting at `position` of `buffer` (bytes, mmap or
    memoryview), which must end at or before `limit`. Returns 0 when `total_size` is 0 or fewer than
    8 bytes are left (no record: a zero tail) and -1 for anything else that is not intact (size out
    of bounds, past `limit`, CRC mismatch)."""
    if position + HEADER_BYTES > limit:
        return 0                        # no room for a header: the segment's tail
    total_size, crc = RECORD_HEADER.unpack_from(buffer, position)
    if total_size == 0:
        return 0
    if total_size < MIN_RECORD_BYTES or position + total_size > limit:
        return -1
    if zlib.crc32(memoryview(buffer)[position + HEADER_BYTES:position + total_size]) != crc:
        return -1
    return int(total_size)


def decode_record(buffer: bytes | memoryview, position: int = 0) -> memoryview:
    """The payload of the intact record at `position`; raises `RecordError` otherwise."""
    total_size = record_size_at(buffer, position, len(buffer))
    if total_size <= 0:
        raise RecordError(f"no intact record at byte {position}")
    return memoryview(buffer)[position + HEADER_BYTES:position + total_size]


def decode_stored_fields(payload: bytes | memoryview) -> list[Any]:
    """The 13 stored fields of a payload (`protocol.message` F_* positions); `RecordError` if the
    payload is not such an array."""
    try:
        values = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise RecordError(f"payload is not msgpack: {exc}") from exc
    if not isinstance(values, list) or len(values) != STORED_FIELD_COUNT:
        raise RecordError("payload is not a stored message array")
    return values


def payload_properties(payload: bytes | memoryview) -> dict[str, str] | None:
    """The properties map of a stored payload, None when the payload is not a stored message.
    The body is never decoded: a payload up to `STREAM_PROPERTIES_FROM_BYTES` is unpacked in one C
    call (cheapest for small messages; the body bytes are copied, not read), a larger one is read
    in 512-byte chunks up to the end of its properties, so a 4 MiB body costs nothing."""
    try:
        if len(payload) < STREAM_PROPERTIES_FROM_BYTES:
            properties = decode_stored_fields(payload)[F_PROPERTIES]
        else:
            unpacker = msgpack.Unpacker(_ChunkReader(memoryview(payload)), read_size=512, raw=False,
                                        strict_map_key=False)
            if unpacker.read_array_header() != STORED_FIELD_COUNT:
                return None
            for _ in range(F_PROPERTIES):
                unpacker.skip()
            properties = unpacker.unpack()
    except (RecordError, ValueError, msgpack.UnpackException, msgpack.OutOfData):
        return None
    return properties if isinstance(properties, dict) else None


class _ChunkReader:
    """A file-like `read(n)` over a memoryview, copying only what is asked for."""

    __slots__ = ("_position", "_view")

    def __init__(self, view: memoryview) -> None:
        self._view, self._position = view, 0

    def read(self, size: int) -> bytes:
        chunk = self._view[self._position:self._position + size]
        self._position += len(chunk)
        return bytes(chunk)


def payload_commit_log_offset(payload: bytes | memoryview) -> int:
    """The commit_log_offset field of a payload, decoding only the fields before it; `RecordError`
    if the payload does not start like a stored message."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(payload), 1))
    unpacker.feed(payload)
    try:
        if unpacker.read_array_header() != STORED_FIELD_COUNT:
            raise RecordError("payload is not a stored message array")
        for _ in range(F_COMMIT_LOG_OFFSET):
            unpacker.skip()
        value = unpacker.unpack()
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData) as exc:
        raise RecordError(f"payload is not msgpack: {exc}") from exc
    if not isinstance(value, int):
        raise RecordError("commit_log_offset field is not an integer")
    return value
