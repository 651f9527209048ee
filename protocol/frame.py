"""Frames (PROTOCOL.md "Frame"): `frame_length:u32be header_length:u32be header body`.

Sans-IO: `encode_frame` returns buffers to write with `writelines`; `FrameDecoder.feed` takes any
chunking of the byte stream and returns whole commands. Every malformed input raises `FrameError`,
never anything else; `FrameError.opaque` is set when the bad frame's opaque could be read, so the
receiver can answer SYSTEM_ERROR before closing."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack

from protocol import native
from protocol.command import Buffer, RemotingCommand
from protocol.errors import FrameError

_LENGTHS = struct.Struct(">II")
_unpackb = msgpack.unpackb
# One Packer for every header: `packb` builds a Packer per call (0.57 against 0.30 µs a header).
# Stateless between calls (it resets after each pack, also after an error) and it packs without
# releasing the GIL, so sharing it across channels and threads is safe.
_pack_header = msgpack.Packer(use_bin_type=True).pack
_U32 = struct.Struct(">I")
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
_JOIN_BODY_BYTES = 4096      # a body up to this size is copied behind the header: one buffer to write


def encode_header(cmd: RemotingCommand) -> bytes:
    return _pack_header(  # type: ignore[no-any-return]
        {"code": cmd.code, "opaque": cmd.opaque, "flag": cmd.flag, "version": cmd.version,
         "remark": cmd.remark, "ext": cmd.fields})


def encode_frame(cmd: RemotingCommand) -> list[Buffer]:
    """The buffers of one frame: lengths + header first, then the body buffer(s) unjoined; a
    small `bytes` body is joined to the header (one buffer, one copy of a few bytes). The usual
    frame (int header fields, a `bytes` body of at most 4 KiB) is written by
    `protocol._speedups.frame_bytes` when it was built: the same bytes."""
    if _c_frame_bytes is not None and type(cmd.body) is bytes:
        data = _c_frame_bytes(cmd, _JOIN_BODY_BYTES)
        if data is not None:
            return [data]
    return encode_frame_py(cmd)


def frame_bytes(cmd: RemotingCommand, max_body_bytes: int) -> bytes | None:
    """The whole frame of `cmd` as one buffer when its body (bytes, bytearray, memoryview or a list
    of them) is at most `max_body_bytes`, else None: `encode_frame`'s buffers joined, built in one
    pass by `protocol._speedups.frame_bytes` when it was built (the usual frame), else in Python."""
    if _c_frame_bytes is not None:
        data = _c_frame_bytes(cmd, max_body_bytes)
        if data is not None:
            return data
    if cmd.body_length() > max_body_bytes:
        return None
    parts = encode_frame_py(cmd)
    return parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)


def encode_frame_py(cmd: RemotingCommand) -> list[Buffer]:
    """`encode_frame` in Python (the reference for the C version, and every unusual frame)."""
    header = encode_header(cmd)
    body = cmd.body
    if type(body) is bytes:
        body_len = len(body)
        if body_len <= _JOIN_BODY_BYTES:
            return [_LENGTHS.pack(4 + len(header) + body_len, len(header)) + header + body]
        return [_LENGTHS.pack(4 + len(header) + body_len, len(header)) + header, body]
    if isinstance(body, bytes | bytearray | memoryview):
        body_len = len(body) if not isinstance(body, memoryview) else body.nbytes
        if body_len == 0:
            return [_LENGTHS.pack(4 + len(header), len(header)) + header]
        return [_LENGTHS.pack(4 + len(header) + body_len, len(header)) + header, body]
    parts = list(body)
    body_len = sum(len(b) if not isinstance(b, memoryview) else b.nbytes for b in parts)
    return [_LENGTHS.pack(4 + len(header) + body_len, len(header)) + header, *parts]


def encode_frame_bytes(cmd: RemotingCommand) -> bytes:
    return b"".join(bytes(b) if isinstance(b, memoryview) else b for b in encode_frame(cmd))


def _int_field(header: dict[Any, Any], key: str, opaque: int | None) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FrameError(f"header {key!r} must be an integer", opaque)
    return value


def decode_header(raw: bytes | bytearray | memoryview) -> tuple[int, int, int, int, str | None, dict[str, Any]]:
    """(code, opaque, flag, version, remark, ext) of a msgpack header; raises `FrameError`."""
    try:
        header = _unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises many types on garbage; all mean "not a header"
        raise FrameError(f"header is not valid msgpack: {exc.__class__.__name__}") from None
    # The well-formed case, checked with exact types inline (this runs for every frame); anything
    # else takes the field-by-field checks below, which name what is wrong.
    if type(header) is dict:
        code, opaque, flag = header.get("code"), header.get("opaque"), header.get("flag", 0)
        version, remark, ext = header.get("version", 1), header.get("remark"), header.get("ext")
        if (type(code) is int and type(opaque) is int and type(flag) is int and type(version) is int
                and (remark is None or type(remark) is str) and type(ext) is dict):
            for key in ext:
                if type(key) is not str:
                    break
            else:
                return code, opaque, flag, version, remark, ext
    return _check_header(header)


def _check_header(header: Any) -> tuple[int, int, int, int, str | None, dict[str, Any]]:
    if not isinstance(header, dict):
        raise FrameError("header is not a msgpack map")
    opaque_value = header.get("opaque")
    opaque = opaque_value if isinstance(opaque_value, int) and not isinstance(opaque_value, bool) else None
    code = _int_field(header, "code", opaque)
    opaque = _int_field(header, "opaque", None)
    flag = header.get("flag", 0)
    version = header.get("version", 1)
    if not isinstance(flag, int) or isinstance(flag, bool):
        raise FrameError("header 'flag' must be an integer", opaque)
    if not isinstance(version, int) or isinstance(version, bool):
        raise FrameError("header 'version' must be an integer", opaque)
    remark = header.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise FrameError("header 'remark' must be a string or nil", opaque)
    ext = header.get("ext", {})
    if ext is None:
        ext = {}
    if not isinstance(ext, dict) or not all(isinstance(k, str) for k in ext):
        raise FrameError("header 'ext' must be a map with string keys", opaque)
    return code, opaque, flag, version, remark, ext


class FrameDecoder:
    """Accumulates bytes and yields complete commands. After a `FrameError` the stream is not
    resynchronised: the connection must be closed.

    `feed(data, max_commands)` decodes at most `max_commands` frames (0: all) and keeps the rest as
    bytes; `more` says it stopped there with a whole frame next in the buffer: `feed(b"", n)`
    takes the next ones. A receiver that handles a few pipelined requests at a time keeps the
    others as their wire bytes, not as decoded commands (~4 times the memory: a 217-byte pull
    request decodes to ~900 bytes of objects)."""

    __slots__ = ("_buffer", "_max_frame_bytes", "more")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self._max_frame_bytes = max_frame_bytes
        self.more = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet decoded: a partial frame, and whole ones while `more`."""
        return len(self._buffer)

    def clear(self) -> None:
        """Drop buffered bytes now (a closed connection's partial frame), not when collected."""
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray | memoryview, max_commands: int = 0) -> list[RemotingCommand]:
        """The whole frames now buffered, as commands, at most `max_commands` of them (0: all);
        raises `FrameError` (see the class)."""
        buf: bytes | bytearray
        if not self._buffer and type(data) is bytes:
            buf = data          # the usual read: whole frames, nothing held over; parsed in place
        else:
            buf = self._buffer
            buf += data
        commands, pos = _decode_frames(buf, self._max_frame_bytes, max_commands)
        # stopped at the limit with (at least the lengths of) a whole frame next
        self.more = (0 < max_commands == len(commands) and len(buf) - pos >= 8
                     and len(buf) - pos >= 4 + _U32.unpack_from(buf, pos)[0])
        if buf is not self._buffer:
            if pos < len(buf):
                self._buffer += buf[pos:]       # a partial frame waits for its next bytes
        elif pos:
            del self._buffer[:pos]
        return commands


def decode_frames_py(buf: bytes | bytearray, max_frame: int,
                     max_commands: int = 0) -> tuple[list[RemotingCommand], int]:
    """The whole frames at the start of `buf` (at most `max_commands` of them, 0: all) and the
    bytes they take; raises `FrameError`. The Python version of `protocol._speedups.decode_frames`
    (its reference)."""
    commands: list[RemotingCommand] = []
    pos, end = 0, len(buf)
    while end - pos >= 8 and (max_commands <= 0 or len(commands) < max_commands):
        frame_length, header_length = _LENGTHS.unpack_from(buf, pos)
        if frame_length < 4:
            raise FrameError(f"frame_length {frame_length} is below 4")
        if frame_length > max_frame:
            raise FrameError(f"frame of {frame_length} bytes exceeds max_frame_bytes {max_frame}")
        if header_length > frame_length - 4:
            raise FrameError(f"header_length {header_length} exceeds the frame ({frame_length})")
        if end - pos < 4 + frame_length:
            break
        header_start = pos + 8
        body_start = header_start + header_length
        frame_end = pos + 4 + frame_length
        code, opaque, flag, version, remark, ext = decode_header(buf[header_start:body_start])
        body = bytes(buf[body_start:frame_end]) if frame_end > body_start else b""
        commands.append(RemotingCommand(code, opaque, flag, remark, ext, body, version))
        pos = frame_end
    return commands, pos


def _native() -> tuple[Callable[[bytes | bytearray, int, int], tuple[list[RemotingCommand], int]],
                       Callable[[RemotingCommand, int], bytes | None] | None]:
    """The C frame functions of `protocol._speedups` when available (see `protocol.native`), else
    `decode_frames_py` and no C encoder."""
    speedups = native.speedups()
    if speedups is None:
        return decode_frames_py, None
    speedups.configure_frames(RemotingCommand, FrameError, _check_header)
    return speedups.decode_frames, speedups.frame_bytes


_decode_frames, _c_frame_bytes = _native()
