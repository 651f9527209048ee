"""The replication stream's codec (pure; docs/ha.md "Wire").

The slave opens with one frame of the remoting protocol (PROTOCOL.md framing), code `HA_HELLO`,
ext {broker_name, broker_id, max_offset}, signed with `auth.inner_credentials` when it has them; the
master answers one frame (SUCCESS with {master_max_offset, start_offset}, or an error code and
remark, then closes). After that both sides switch to fixed binary headers, as RocketMQ's HA stream:

- master → slave: `>BQI` kind, commit_log_offset, length, then `length` bytes. DATA: commit-log
  bytes at commit_log_offset (whole records, one file); HEARTBEAT: length 0, offset = the master's
  commit-log end; METADATA: a msgpack map of topics, groups, offsets and delay offsets.
- slave → master: `>Q` the slave's acknowledged commit-log end (written, and fsynced under
  SYNC_FLUSH), after every write and every heartbeat.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, request

HA_HELLO = 9_001                  # the first frame of a replication connection (not a broker request)
TRANSFER_HEADER = struct.Struct(">BQI")
ACK = struct.Struct(">Q")
KIND_DATA, KIND_HEARTBEAT, KIND_METADATA = 0, 1, 2
MAX_EPOCHS = 4_096                # epoch entries a hello may carry
MAX_HELLO_BYTES = 256 * 1024       # a hello (or its answer) larger than this closes the connection
INT64_MAX = (1 << 63) - 1


class HAProtocolError(Exception):
    """The peer broke the replication protocol (a bad hello, an ack past what was sent, a transfer
    that does not fit): the connection is closed."""


@dataclass(frozen=True, slots=True)
class Hello:
    broker_name: str
    broker_id: int
    max_offset: int               # the slave's commit-log end: the master streams from here
    epochs: tuple[tuple[int, int], ...] | None = None   # controller mode: (epoch, start offset), oldest first


def hello_command(hello: Hello) -> RemotingCommand:
    """The slave's first frame (sign it before sending when auth is on)."""
    fields: dict[str, object] = {"broker_name": hello.broker_name, "broker_id": hello.broker_id,
                                 "max_offset": hello.max_offset}
    if hello.epochs is not None:
        fields["epochs"] = [list(entry) for entry in hello.epochs]
    return request(HA_HELLO, fields)


def parse_hello(command: RemotingCommand) -> Hello:
    """The `Hello` of a slave's first frame; raises `HAProtocolError` for anything else (another
    code, a missing or mistyped field, an id or offset out of range)."""
    fields = command.fields
    name, broker_id, max_offset = fields.get("broker_name"), fields.get("broker_id"), fields.get("max_offset")
    if command.code != HA_HELLO or command.is_response:
        raise HAProtocolError(f"expected HA_HELLO ({HA_HELLO}), got code {command.code}")
    if type(name) is not str or type(broker_id) is not int or type(max_offset) is not int:
        raise HAProtocolError("HA_HELLO needs broker_name (str), broker_id (int) and max_offset (int)")
    if not 0 <= broker_id <= 1_000 or not 0 <= max_offset <= INT64_MAX:
        raise HAProtocolError(f"HA_HELLO out of range: broker_id {broker_id}, max_offset {max_offset}")
    return Hello(name, broker_id, max_offset, parse_epochs(fields.get("epochs")))


def parse_epochs(value: object) -> tuple[tuple[int, int], ...] | None:
    """A list of [epoch, start_offset] pairs (None: absent); raises `HAProtocolError` for anything
    else, more than `MAX_EPOCHS` entries or a value out of int64."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_EPOCHS:
        raise HAProtocolError(f"epochs must be a list of at most {MAX_EPOCHS} [epoch, offset] pairs")
    entries = []
    for entry in value:
        if (not isinstance(entry, list) or len(entry) != 2 or not all(type(v) is int for v in entry)
                or not all(0 <= v <= INT64_MAX for v in entry)):
            raise HAProtocolError(f"bad epoch entry {entry!r}")
        entries.append((entry[0], entry[1]))
    return tuple(entries)


def hello_answer(request: RemotingCommand, *, master_max_offset: int, start_offset: int,
                 epochs: list[tuple[int, int]] | None = None) -> RemotingCommand:
    """The master's SUCCESS answer: its commit-log end, where the stream starts and (controller
    mode) its epochs, which the slave copies as its log reaches them."""
    fields: dict[str, object] = {"master_max_offset": master_max_offset, "start_offset": start_offset}
    if epochs is not None:
        fields["epochs"] = [list(entry) for entry in epochs]
    return request.response(header=fields)


def truncate_answer(request: RemotingCommand, offset: int) -> RemotingCommand:
    """Controller mode: the slave's log diverged after `offset` (a deposed master's tail never
    acknowledged in sync): it truncates there and says hello again."""
    return request.response(ResponseCode.SYSTEM_ERROR, header={"truncate_to": offset},
                            remark=f"your log diverged from the master's after commit-log offset {offset}: truncate")


def hello_refusal(request: RemotingCommand, code: ResponseCode, remark: str) -> RemotingCommand:
    """The master's answer to a hello it refuses (then it closes the connection)."""
    return request.response(code, remark=remark)


def transfer_header(kind: int, commit_log_offset: int, length: int) -> bytes:
    return TRANSFER_HEADER.pack(kind, commit_log_offset, length)


def parse_transfer_header(data: bytes, max_length: int) -> tuple[int, int, int]:
    """(kind, commit_log_offset, length) of a master's transfer header; raises `HAProtocolError`
    for an unknown kind, an offset past int64 or a length over `max_length`."""
    kind, commit_log_offset, length = TRANSFER_HEADER.unpack(data)
    if kind not in (KIND_DATA, KIND_HEARTBEAT, KIND_METADATA):
        raise HAProtocolError(f"unknown transfer kind {kind}")
    if commit_log_offset > INT64_MAX or length > max_length:
        raise HAProtocolError(f"transfer out of bounds: offset {commit_log_offset}, {length} bytes")
    return kind, commit_log_offset, length
