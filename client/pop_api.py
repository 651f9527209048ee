"""The POP requests of `ClientAPI` (kept beside it, `client/api.py` being at its size bound): each
sends one request to a broker address and returns typed values or raises the response code's
`ResponseError` (`ReceiptHandleExpired` for a stale receipt handle), `RequestTimeout` or
`ConnectionClosed`."""

from __future__ import annotations

from dataclasses import dataclass

from client.remoting.remoting_client import RemotingClient
from protocol import headers_v5 as v5
from protocol.bodies import decode_batch_ack_result, encode_batch_ack
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import ProtocolError, ResponseError, error_for
from protocol.message import MessageExt, decode_message_batch


@dataclass(frozen=True, slots=True)
class PoppedMessage:
    """One popped message: `message.reconsume_times` is this delivery's (attempt - 1)."""

    message: MessageExt
    receipt_handle: str


class PopAPI:
    def __init__(self, remoting: RemotingClient) -> None:
        self.remoting = remoting

    async def pop_message(self, address: str, header: v5.PopMessageRequestHeader,
                          timeout_ms: int) -> list[PoppedMessage]:
        """[] when nothing became visible within `header.poll_time` (PULL_NOT_FOUND)."""
        messages, handles = await self.pop(address, header, timeout_ms)
        return [PoppedMessage(m, h) for m, h in zip(messages, handles, strict=True)]

    async def pop(self, address: str, header: v5.PopMessageRequestHeader,
                  timeout_ms: int) -> tuple[list[MessageExt], list[str]]:
        """`pop_message` as (messages, receipt handles), side by side: no object per message
        beyond its `MessageExt` (the consumer wraps each once, in its own view)."""
        response = await self.remoting.invoke(address, request(RequestCode.POP_MESSAGE, header), timeout_ms)
        if response.code == ResponseCode.PULL_NOT_FOUND:
            return [], []
        if response.code != ResponseCode.SUCCESS:
            raise error_for(response.code, response.remark)
        messages = decode_message_batch(response.body_bytes()) if response.body else []
        handles = str(response.fields.get("extra_infos", "")).split("\n")
        times = str(response.fields.get("reconsume_times", "")).split(",")
        if len(handles) != len(messages) or len(times) != len(messages):
            raise ProtocolError(f"POP response has {len(messages)} messages but {len(handles)} receipt handles")
        for message, reconsume_times in zip(messages, times, strict=True):
            message.reconsume_times = int(reconsume_times)
        return messages, handles

    async def ack_message(self, address: str, header: v5.AckMessageRequestHeader, timeout_ms: int) -> None:
        response = await self.remoting.invoke(address, request(RequestCode.ACK_MESSAGE, header), timeout_ms)
        if response.code != ResponseCode.SUCCESS:
            raise error_for(response.code, response.remark)

    async def batch_ack_message(self, address: str, consumer_group: str, topic: str,
                                acks: list[tuple[int, str, int]], timeout_ms: int) -> list[ResponseError | None]:
        """BATCH_ACK_MESSAGE of (queue_id, receipt handle, queue offset) acks; per ack None (acked)
        or its error (`ReceiptHandleExpired`, ...). Raises for the request as a whole."""
        header = v5.BatchAckMessageRequestHeader(consumer_group=consumer_group, topic=topic)
        response = await self.remoting.invoke(
            address, request(RequestCode.BATCH_ACK_MESSAGE, header, encode_batch_ack(acks)), timeout_ms)
        if response.code != ResponseCode.SUCCESS:
            raise error_for(response.code, response.remark)
        codes, remarks = decode_batch_ack_result(response.body_bytes())
        if len(codes) != len(acks) or len(remarks) != len(acks):
            raise ProtocolError(f"BATCH_ACK_MESSAGE answered {len(codes)} codes for {len(acks)} acks")
        if not any(codes):          # all SUCCESS (0), the usual answer
            return [None] * len(codes)
        return [None if code == ResponseCode.SUCCESS else error_for(code, remark)
                for code, remark in zip(codes, remarks, strict=True)]

    async def change_invisible_time(self, address: str, header: v5.ChangeInvisibleTimeRequestHeader,
                                    timeout_ms: int) -> v5.ChangeInvisibleTimeResponseHeader:
        response = await self.remoting.invoke(address, request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header),
                                              timeout_ms)
        if response.code != ResponseCode.SUCCESS:
            raise error_for(response.code, response.remark)
        return v5.ChangeInvisibleTimeResponseHeader.from_fields(response.fields)

    async def notification(self, address: str, header: v5.NotificationRequestHeader, timeout_ms: int) -> bool:
        response = await self.remoting.invoke(address, request(RequestCode.NOTIFICATION, header), timeout_ms)
        if response.code != ResponseCode.SUCCESS:
            raise error_for(response.code, response.remark)
        return v5.NotificationResponseHeader.from_fields(response.fields).has_msg
