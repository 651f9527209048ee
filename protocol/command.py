"""`RemotingCommand`: one request or response, as PROTOCOL.md's header plus a raw body."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode

if TYPE_CHECKING:
    from protocol.headers import Header

Buffer = bytes | bytearray | memoryview
# A body is raw bytes, or several buffers written back to back without being joined.
Body = Buffer | Sequence[Buffer]


@dataclass(slots=True)
class RemotingCommand:
    """`fields` is the header's `ext` map; `body` is bytes when decoded, or a sequence of buffers
    when built for sending (a pull response is the stored messages side by side)."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    body: Body = b""
    version: int = 1

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def body_bytes(self) -> bytes:
        body = self.body
        if isinstance(body, bytes):
            return body
        if isinstance(body, bytearray | memoryview):
            return bytes(body)
        return b"".join(body)

    def body_length(self) -> int:
        body = self.body
        if isinstance(body, bytes | bytearray):
            return len(body)
        if isinstance(body, memoryview):
            return body.nbytes
        return sum(len(b) if not isinstance(b, memoryview) else b.nbytes for b in body)

    def response(self, code: int = ResponseCode.SUCCESS, header: Header | Mapping[str, Any] | None = None,
                 body: Body = b"", remark: str | None = None) -> RemotingCommand:
        """A response to this request: same opaque, RESPONSE flag set."""
        return RemotingCommand(code=int(code), opaque=self.opaque, flag=FLAG_RESPONSE,
                               remark=remark, fields=_fields_of(header), body=body)


def request(code: int, header: Header | Mapping[str, Any] | None = None, body: Body = b"",
            *, oneway: bool = False) -> RemotingCommand:
    """A request; the channel assigns its opaque when it is sent."""
    return RemotingCommand(code=int(code), flag=FLAG_ONEWAY if oneway else 0, fields=_fields_of(header), body=body)


def _fields_of(header: Header | Mapping[str, Any] | None) -> dict[str, Any]:
    if header is None:
        return {}
    if isinstance(header, Mapping):
        return dict(header)
    return header.to_fields()
