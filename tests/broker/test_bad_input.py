"""Bad input at the socket level: answered with a clear error, nothing lost, others keep working."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import msgpack
import pytest

from broker.broker import Broker
from client import Message, MessageQueue, Producer
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import MessageIllegal, SystemError_
from protocol.frame import FrameDecoder, encode_frame_bytes
from protocol.headers import SendMessageRequestHeader
from protocol.model import PullStatus
from tests.conftest import broker_config
from tests.helpers import held_pulls, pull_header, send


async def _raw(broker: Broker, payload: bytes) -> tuple[list[RemotingCommand], bool]:
    """Send raw bytes; return the responses read and whether the broker closed the connection."""
    host, port = broker.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    await writer.drain()
    decoder, commands, closed = FrameDecoder(), [], False
    try:
        async with asyncio.timeout(1):
            while True:
                data = await reader.read(65536)
                if not data:
                    closed = True
                    break
                commands.extend(decoder.feed(data))
    except TimeoutError:
        pass
    writer.close()
    return commands, closed


def _frame(header: object, body: bytes = b"") -> bytes:
    raw: bytes = msgpack.packb(header)
    return struct.pack(">II", 4 + len(raw) + len(body), len(raw)) + raw + body


async def test_garbage_and_malformed_frames_close_only_that_connection(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "keep", b"safe")
    _, closed = await _raw(broker, b"\xff" * 64)
    assert closed
    responses, closed = await _raw(broker, _frame({"code": 10, "opaque": 7, "ext": [1, 2]}))
    assert closed and responses[0].opaque == 7 and responses[0].code == ResponseCode.SYSTEM_ERROR
    assert "ext" in (responses[0].remark or "")
    _, closed = await _raw(broker, struct.pack(">II", 64 * 1024 * 1024, 10))    # oversized frame
    assert closed
    _, closed = await _raw(broker, struct.pack(">II", 2, 0))                      # frame_length < 4
    assert closed
    result = await client_api.pull_message(broker.address, pull_header(topic="keep"), 3_000)
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"safe"]


async def test_unknown_code_and_mistyped_fields(broker: Broker) -> None:
    unknown = encode_frame_bytes(RemotingCommand(code=9999, opaque=1))
    responses, closed = await _raw(broker, unknown)
    assert not closed and responses[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    bad = request(RequestCode.GET_MAX_OFFSET, {"topic": "t", "queue_id": True})
    bad.opaque = 2
    responses, _ = await _raw(broker, encode_frame_bytes(bad))
    assert responses[0].code == ResponseCode.SYSTEM_ERROR
    assert "queue_id" in (responses[0].remark or "") and "int" in (responses[0].remark or "")
    missing = request(RequestCode.PULL_MESSAGE, {"topic": "t"})
    missing.opaque = 3
    responses, _ = await _raw(broker, encode_frame_bytes(missing))
    assert responses[0].code == ResponseCode.SYSTEM_ERROR and "consumer_group" in (responses[0].remark or "")


async def test_oversized_body_bad_names_and_bad_batches(broker: Broker, client_api: ClientAPI) -> None:
    header = SendMessageRequestHeader(producer_group="pg", topic="big", queue_id=0, properties={})
    with pytest.raises(MessageIllegal, match="max_message_bytes"):
        await client_api.send_message(broker.address, header, b"x" * (4 * 1024 * 1024 + 1))
    bad_topic = SendMessageRequestHeader(producer_group="pg", topic="a/b", queue_id=0, properties={})
    with pytest.raises(SystemError_, match="must match"):
        await client_api.send_message(broker.address, bad_topic, b"x")
    with pytest.raises(SystemError_, match="queue_id"):
        await client_api.send_message(broker.address, SendMessageRequestHeader(
            producer_group="pg", topic="big", queue_id=99, properties={}), b"x")
    for body in (b"\xc1", msgpack.packb([]), msgpack.packb([[{}, 0]]), msgpack.packb([[{"a": 1}, 0, b""]]),
                 msgpack.packb([[{}, 0, b"x"]] * 2000)):
        cmd = request(RequestCode.SEND_BATCH_MESSAGE, {"producer_group": "pg", "topic": "big", "queue_id": 0},
                      body)
        response = await client_api.remoting.invoke(broker.address, cmd, 3_000)
        assert response.code == ResponseCode.MESSAGE_ILLEGAL, body[:20]
    assert await client_api.get_max_offset(broker.address, "big", 0) == 0   # nothing was stored


async def test_a_connection_with_too_many_requests_in_flight_is_paused(tmp_path: Path) -> None:
    """Back-pressure: past `max_in_flight_per_connection` the broker stops reading that connection
    (its memory stays bounded) and resumes once half of the requests are answered."""
    async with Broker(broker_config(tmp_path, max_in_flight_per_connection=8)) as broker:
        remoting = RemotingClient()
        api = ClientAPI(remoting)
        try:
            await send(api, broker.address, "bp")
            held = [asyncio.create_task(api.pull_message(
                broker.address, pull_header(topic="bp", queue_offset=1, suspend_timeout_ms=20_000), 25_000))
                for _ in range(8)]
            await held_pulls(broker, topic="bp", count=8)
            blocked = asyncio.create_task(api.get_max_offset(broker.address, "bp", 0, timeout_ms=10_000))
            done, _ = await asyncio.wait({blocked}, timeout=0.3)
            assert not done, "the ninth request was read although eight were in flight"
            async with Producer("pg", broker.address) as other_connection:   # other connections go on
                await other_connection.send(Message("bp", b"wake", tags="x"), queue=MessageQueue("bp", "", 0))
            assert all(r.status is PullStatus.FOUND for r in await asyncio.wait_for(asyncio.gather(*held), 2))
            assert await asyncio.wait_for(blocked, 2) == 2
        finally:
            await remoting.close()
