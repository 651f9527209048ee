"""docs/protocol.md agrees with the code: the worked example's hex dump and the quoted remarks."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from protocol.bodies import HeartbeatData, decode_body
from protocol.codes import PROTOCOL_VERSION, RequestCode
from protocol.command import request
from protocol.errors import MissingHeaderField
from protocol.frame import FrameDecoder, encode_frame_bytes
from protocol.headers import SendMessageRequestHeader

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
_DUMP_LINE = re.compile(r"^([0-9a-f]{4})  ((?:[0-9a-f]{2} ){0,15}[0-9a-f]{2})")


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def worked_example_bytes() -> bytes:
    section = doc_text().split("## Worked example", 1)[1]
    data = bytearray()
    for line in section.splitlines():
        match = _DUMP_LINE.match(line)
        if match:
            assert int(match.group(1), 16) == len(data), "dump offsets must be contiguous"
            data += bytes.fromhex(match.group(2))
    return bytes(data)


def test_doc_states_version_1() -> None:
    assert PROTOCOL_VERSION == 1
    assert "version 1" in doc_text().splitlines()[0]


def test_worked_example_decodes_and_matches_the_encoder() -> None:
    wire = worked_example_bytes()
    assert len(wire) == 176
    (cmd,) = FrameDecoder().feed(wire)
    header = SendMessageRequestHeader(producer_group="pg", topic="t", queue_id=0,
                                      born_timestamp=1_700_000_000_000, properties={"TAGS": "a"})
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version) == (RequestCode.SEND_MESSAGE, 1, 0, 1)
    assert cmd.remark is None
    assert SendMessageRequestHeader.from_fields(cmd.fields) == header
    assert cmd.body == b"hi"
    sent = request(RequestCode.SEND_MESSAGE, header, body=b"hi")
    sent.opaque = 1
    assert encode_frame_bytes(sent) == wire


def test_quoted_field_error_remarks_are_what_the_code_says() -> None:
    text = doc_text()
    base = {"producer_group": "g", "topic": "t", "queue_id": 0, "properties": {}}
    heartbeat = {"client_id": "c", "consumer_data_set": [
        {"group_name": "g", "subscription_data_set": [{"topic": "t", "sub_version": "1"}]}]}
    decoders: list[Callable[[], object]] = [
        lambda: SendMessageRequestHeader.from_fields({k: v for k, v in base.items() if k != "queue_id"}),
        lambda: SendMessageRequestHeader.from_fields({**base, "queue_id": True}),
        lambda: SendMessageRequestHeader.from_fields({**base, "properties": {"TAGS": 7}}),
        lambda: decode_body(HeartbeatData, msgpack.packb(heartbeat)),
    ]
    for decode in decoders:
        with pytest.raises(MissingHeaderField) as info:
            decode()
        assert info.value.remark in text, info.value.remark
