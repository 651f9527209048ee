"""The on-disk commit-log record, pure: `u32be total_size`, `u32be crc32(payload)`, `payload`.

`total_size` counts the whole record, this 8-byte header included; `payload` is the stored message
exactly as `protocol.message.encode_stored_message` writes it (a 13-field msgpack array), so a pull
answers with stored payloads side by side and decodes nothing. A `total_size` of 0 is never a record:
it is the zero tail of a segment (RocketMQ's BLANK end-of-file record) or the end of data.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from protocol import native
from protocol.message import (
    F_BODY,
    F_BORN_HOST,
    F_BORN_TIMESTAMP,
    F_COMMIT_LOG_OFFSET,
    F_FLAG,
    F_PROPERTIES,
    F_QUEUE_ID,
    F_QUEUE_OFFSET,
    F_RECONSUME_TIMES,
    F_STORE_HOST,
    F_STORE_TIMESTAMP,
    F_SYS_FLAG,
    F_TOPIC,
    STORED_FIELD_COUNT,
)

RECORD_HEADER = struct.Struct(">II")
HEADER_BYTES = RECORD_HEADER.size
MIN_RECORD_BYTES = HEADER_BYTES + 1     # the smallest msgpack value is one byte
STREAM_PROPERTIES_FROM_BYTES = 16 * 1024


class RecordError(ValueError):
    """Bytes that are not a complete, intact record."""


RunHead = tuple[str, int, int, int, str, int, str, int]
"""What the messages of one run share: (topic, queue_id, sys_flag, born_timestamp, born_host,
store_timestamp, store_host, reconsume_times)."""
RunMessage = tuple[dict[str, str], int, bytes]                # (properties, flag, body)
EncodedRun = tuple[bytes, list[int], list[int]]              # (records, commit_log_offsets, sizes)
_pack_stored = msgpack.Packer(use_bin_type=True).pack      # stateless between calls: safe to share


def encode_run_py(head: RunHead, messages: Sequence[RunMessage], start: int, first_queue_offset: int,
                  position: int, limit: int) -> EncodedRun:
    """The records of `messages[start:]` appended one after another from commit-log offset
    `position` (message i at queue offset `first_queue_offset + i`), stopping before the first
    that would end past `limit` (the end of the current file): the records' bytes, and each one's
    commit_log_offset and total size. The Python version of `encode_run` (its reference)."""
    topic, queue_id, sys_flag, born_timestamp, born_host, store_timestamp, store_host, reconsume_times = head
    fields: list[Any] = [topic, queue_id, 0, 0, 0, sys_flag, born_timestamp, born_host, store_timestamp,
                         store_host, reconsume_times, None, None]
    chunks: list[bytes] = []
    offsets: list[int] = []
    sizes: list[int] = []
    header, crc32 = RECORD_HEADER.pack, zlib.crc32
    for index in range(start, len(messages)):
        fields[F_PROPERTIES], fields[F_FLAG], fields[F_BODY] = messages[index]
        fields[F_QUEUE_OFFSET] = first_queue_offset + index
        fields[F_COMMIT_LOG_OFFSET] = position
        payload: bytes = _pack_stored(fields)
        total = len(payload) + HEADER_BYTES
        if position + total > limit:
            break
        chunks.append(header(total, crc32(payload)))
        chunks.append(payload)
        offsets.append(position)
        sizes.append(total)
        position += total
    return b"".join(chunks), offsets, sizes


_records = native.load("broker.store._records")
_c_encode_run: Callable[..., EncodedRun | None] | None = _records.encode_run if _records is not None else None


def encode_run(head: RunHead, messages: Sequence[RunMessage], start: int, first_queue_offset: int,
               position: int, limit: int) -> EncodedRun:
    """`encode_run_py`'s records, encoded by `broker.store._records` (C) when it was built: the
    same bytes, in about a third of the time for the usual batch (a msgpack array and a CRC per
    message, no Python per message). Anything unusual takes the Python version."""
    if _c_encode_run is not None and type(messages) is list:
        encoded = _c_encode_run(head, messages, start, first_queue_offset, position, limit, zlib.crc32)
        if encoded is not None:
            return encoded
    return encode_run_py(head, messages, start, first_queue_offset, position, limit)


def write_record_py(buffer: Any, relative: int, limit: int, head: RunHead, queue_offset: int,
                    commit_log_offset: int, message: RunMessage) -> int:
    """Write the record `encode_run_py(head, [message], 0, queue_offset, commit_log_offset, ...)`
    encodes into `buffer` (a commit-log file's mmap) at `relative`: its total size, or 0 (nothing
    written) when it would end past `limit` (the end of the file, relative to `buffer`; callers
    keep `0 <= relative <= limit <= len(buffer)`). Raises what msgpack raises for values it cannot
    pack (nothing written). The Python version of `write_record` (its reference)."""
    data, offsets, _ = encode_run_py(head, [message], 0, queue_offset, commit_log_offset,
                                     commit_log_offset + limit - relative)
    if not offsets:
        return 0
    buffer[relative:relative + len(data)] = data
    return len(data)


_c_write_record: Callable[..., int | None] | None = _records.write_record if _records is not None else None


def write_record(buffer: Any, relative: int, limit: int, head: RunHead, queue_offset: int, commit_log_offset: int,
                 message: RunMessage) -> int:
    """`write_record_py`, in C when `broker.store._records` was built (the one-message send path:
    the payload encoded, its CRC taken and the record copied into the map in one call, with no
    bytes object or slice assignment per send). Anything unusual takes the Python version."""
    if _c_write_record is not None:
        written = _c_write_record(buffer, relative, limit, head, queue_offset, commit_log_offset, message, zlib.crc32)
        if written is not None:
            return written
    return write_record_py(buffer, relative, limit, head, queue_offset, commit_log_offset, message)


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


StoredEntry = tuple[int, int, str, int, int, int, dict[str, str]]
"""(commit_log_offset, total_size, topic, queue_id, queue_offset, store_timestamp, properties)."""

_INT_FIELDS = (F_QUEUE_ID, F_QUEUE_OFFSET, F_COMMIT_LOG_OFFSET, F_FLAG, F_SYS_FLAG, F_BORN_TIMESTAMP,
               F_STORE_TIMESTAMP, F_RECONSUME_TIMES)
_STR_FIELDS = (F_TOPIC, F_BORN_HOST, F_STORE_HOST)


def stored_entry(commit_log_offset: int, total_size: int, fields: list[Any]) -> StoredEntry:
    """The `StoredEntry` of a record at `commit_log_offset` whose payload decoded to `fields`."""
    return (commit_log_offset, total_size, fields[F_TOPIC], fields[F_QUEUE_ID], fields[F_QUEUE_OFFSET],
            fields[F_STORE_TIMESTAMP], fields[F_PROPERTIES])


def _usual_stored(payload: memoryview) -> list[Any] | None:
    if payload[0] != 0x90 | STORED_FIELD_COUNT:
        return None
    try:
        fields = decode_stored_fields(payload)
    except (RecordError, TypeError):       # (TypeError: a list or map as a map key)
        return None
    properties = fields[F_PROPERTIES]
    if (any(type(fields[i]) is not int for i in _INT_FIELDS) or any(type(fields[i]) is not str for i in _STR_FIELDS)
            or type(properties) is not dict or type(fields[F_BODY]) is not bytes
            or any(type(k) is not str or type(v) is not str for k, v in properties.items())):
        return None
    return fields


def read_stored_py(buffer: Any, relative: int, limit: int, base: int, max_count: int) -> list[StoredEntry]:
    """The records of `buffer` (a commit-log file's map) from `relative` on, read back for reput:
    a `StoredEntry` per record that is intact (`record_size_at` with `limit`) and a usual stored
    message (a fixarray of 13, ints, str topic and hosts, a dict of str to str properties, a bytes
    body), its offset `base + position`. Stops at the first record that is not (a zero tail, a
    damaged or an unusual record, which the caller looks at itself), or after `max_count` entries.
    `ValueError` unless 0 <= relative <= limit <= len(buffer). The reference of
    `broker.store._records.read_stored` (C)."""
    if not 0 <= relative <= limit <= len(buffer):
        raise ValueError("read_stored: relative and limit must lie within the buffer")
    entries: list[StoredEntry] = []
    position = relative
    while len(entries) < max_count:
        size = record_size_at(buffer, position, limit)
        if size <= 0:
            break
        fields = _usual_stored(memoryview(buffer)[position + HEADER_BYTES:position + size])
        if fields is None:
            break
        entries.append(stored_entry(base + position, size, fields))
        position += size
    return entries


_c_read_stored: Callable[..., list[StoredEntry]] | None = _records.read_stored if _records is not None else None


def read_stored(buffer: Any, relative: int, limit: int, base: int, max_count: int) -> list[StoredEntry]:
    """`read_stored_py`, in C when `broker.store._records` was built (no Python per record: a
    slave's reput read every record it copied this way, a quarter of its CPU in Python)."""
    if _c_read_stored is not None:
        return _c_read_stored(buffer, relative, limit, base, max_count, zlib.crc32)
    return read_stored_py(buffer, relative, limit, base, max_count)


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
