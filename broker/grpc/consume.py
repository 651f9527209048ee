"""ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue of
`apache.rocketmq.v2.MessagingService` over the broker's POP (Java proxy: `ReceiveMessageActivity`,
`AckMessageActivity`, `ChangeInvisibleDurationActivity`, `ForwardMessageToDLQActivity`).

A receive is one POP_MESSAGE of any queue (`queue_id` -1: the broker picks, as the proxy's
assignments say) held up to the call's long-polling timeout, cut so the answer beats the call's
deadline; its stream is the delivery time, the messages (receipt handle, invisible duration and
attempt in each), then the status (MESSAGE_NOT_FOUND when none came). A receipt handle is the
broker's own (`broker.pop.handle`), so an ack needs nothing else."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from broker.grpc.calls import Caller, resource_name
from broker.grpc.convert import to_proto
from broker.grpc.produce import Context
from broker.grpc.proto import definition_pb2 as pb
from broker.grpc.proto import service_pb2 as spb
from broker.grpc.status import GrpcError, of_response, ok, status
from broker.grpc.telemetry import TelemetryCalls
from broker.pop.handle import ReceiptHandle
from broker.pop.processor import MAX_INVISIBLE_TIME_MS, MAX_POLL_TIME_MS, MAX_POP_NUMS
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request as remoting_request
from protocol.errors import MQError
from protocol.headers_v5 import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    PopMessageRequestHeader,
)
from protocol.message import PROPERTY_UNIQ_KEY, decode_message_batch

MIN_INVISIBLE_TIME_MS = 1_000
DEFAULT_INVISIBLE_TIME_MS = 30_000      # a push consumer's receive that names none (it renews itself)
DEFAULT_POLL_TIME_MS = 20_000
DEADLINE_MARGIN_MS = 500                # a held receive answers this long before the call's deadline
MAX_ACK_ENTRIES = 1_024


def _ms(duration: object) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000   # type: ignore[attr-defined]


def receipt_handle(text: str) -> ReceiptHandle:
    """The broker's receipt handle `text`; raises `GrpcError` INVALID_RECEIPT_HANDLE."""
    try:
        return ReceiptHandle.parse(text)
    except MQError:
        raise GrpcError(pb.INVALID_RECEIPT_HANDLE, f"receipt handle {text[:100]!r} is not one this broker gave") \
            from None


def _invisible_ms(duration: object) -> int:
    invisible_ms = _ms(duration)
    if not MIN_INVISIBLE_TIME_MS <= invisible_ms <= MAX_INVISIBLE_TIME_MS:
        raise GrpcError(pb.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms is outside "
                                                   f"[{MIN_INVISIBLE_TIME_MS}, {MAX_INVISIBLE_TIME_MS}]")
    return invisible_ms


class ConsumeCalls(TelemetryCalls):
    async def ReceiveMessage(self, request: spb.ReceiveMessageRequest,
                             context: Context) -> AsyncIterator[spb.ReceiveMessageResponse]:
        caller: Caller | None = None
        try:
            caller = self.caller(context)
            header = self._pop_header(request, context)
            response = await self.invoke(caller, RequestCode.POP_MESSAGE, header, raise_error=False)
        except Exception as exc:
            yield spb.ReceiveMessageResponse(status=self.error_status(exc, caller))
            return
        if response.code == ResponseCode.PULL_NOT_FOUND or (response.code == ResponseCode.SUCCESS
                                                             and not response.body):
            yield spb.ReceiveMessageResponse(status=status(pb.MESSAGE_NOT_FOUND, "no new message"))
            return
        if response.code != ResponseCode.SUCCESS:
            yield spb.ReceiveMessageResponse(status=of_response(response.code, response.remark))
            return
        messages = decode_message_batch(response.body_bytes())
        handles = str(response.fields.get("extra_infos", "")).split("\n")
        times = str(response.fields.get("reconsume_times", "")).split(",")
        delivered = spb.ReceiveMessageResponse()
        now_ms = self.parts.clock.now_ms()
        delivered.delivery_timestamp.seconds, millis = divmod(now_ms, 1000)
        delivered.delivery_timestamp.nanos = millis * 1_000_000
        yield delivered
        for message, handle, reconsume_times in zip(messages, handles, times, strict=False):
            message.reconsume_times = int(reconsume_times or 0)
            msg_id = message.properties.get(PROPERTY_UNIQ_KEY) or message.msg_id
            yield spb.ReceiveMessageResponse(message=to_proto(message, msg_id=msg_id, receipt_handle=handle,
                                                              invisible_ms=header.invisible_time))
        yield spb.ReceiveMessageResponse(status=ok())

    def _pop_header(self, request: spb.ReceiveMessageRequest, context: Context) -> PopMessageRequestHeader:
        group = resource_name(request.group, "group")
        topic = resource_name(request.message_queue.topic, "topic")
        if not 0 < request.batch_size <= MAX_POP_NUMS:
            raise GrpcError(pb.BAD_REQUEST, f"batch size {request.batch_size} is outside [1, {MAX_POP_NUMS}]")
        invisible_ms = (_invisible_ms(request.invisible_duration) if request.HasField("invisible_duration")
                        else DEFAULT_INVISIBLE_TIME_MS)
        poll_ms = _ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") \
            else DEFAULT_POLL_TIME_MS
        if not 0 <= poll_ms <= MAX_POLL_TIME_MS:
            raise GrpcError(pb.ILLEGAL_POLLING_TIME, f"long polling timeout {poll_ms} ms is outside "
                                                     f"[0, {MAX_POLL_TIME_MS}]")
        remaining = context.time_remaining()
        if remaining is not None:
            poll_ms = max(0, min(poll_ms, int(remaining * 1000) - DEADLINE_MARGIN_MS))
        expression = request.filter_expression
        exp_type = "SQL92" if expression.type == pb.SQL else "TAG"
        return PopMessageRequestHeader(
            consumer_group=group, topic=topic, queue_id=-1, max_msg_nums=request.batch_size,
            invisible_time=invisible_ms, poll_time=poll_ms, born_time=int(time.time() * 1000), init_mode=0,
            exp_type=exp_type, exp=expression.expression or "*")

    async def AckMessage(self, request: spb.AckMessageRequest, context: Context) -> spb.AckMessageResponse:
        """Each entry acked on its own (ACK_MESSAGE); the response's status is OK when all were, the
        entry's when there is one, else MULTIPLE_RESULTS."""
        async def run(caller: Caller) -> spb.AckMessageResponse:
            group = resource_name(request.group, "group")
            topic = resource_name(request.topic, "topic")
            if not 0 < len(request.entries) <= MAX_ACK_ENTRIES:
                raise GrpcError(pb.BAD_REQUEST, f"an ack has 1 to {MAX_ACK_ENTRIES} entries")
            results = []
            for entry in request.entries:
                try:
                    handle = receipt_handle(entry.receipt_handle)
                    await self.invoke(caller, RequestCode.ACK_MESSAGE, AckMessageRequestHeader(
                        consumer_group=group, topic=topic, queue_id=handle.queue_id, extra_info=entry.receipt_handle,
                        offset=handle.queue_offset))
                    result = ok()
                except Exception as exc:
                    result = self.error_status(exc, caller)
                results.append(spb.AckMessageResultEntry(message_id=entry.message_id,
                                                         receipt_handle=entry.receipt_handle, status=result))
            failed = [r.status for r in results if r.status.code != pb.OK]
            overall = ok() if not failed else failed[0] if len(results) == 1 else status(
                pb.MULTIPLE_RESULTS, f"{len(failed)} of {len(results)} acks failed")
            return spb.AckMessageResponse(status=overall, entries=results)
        return await self.guarded(context, spb.AckMessageResponse, run)

    async def ChangeInvisibleDuration(self, request: spb.ChangeInvisibleDurationRequest,
                                      context: Context) -> spb.ChangeInvisibleDurationResponse:
        """The message stays invisible `invisible_duration` from now; answers its new receipt handle
        (the old one is stale from then on)."""
        async def run(caller: Caller) -> spb.ChangeInvisibleDurationResponse:
            group = resource_name(request.group, "group")
            topic = resource_name(request.topic, "topic")
            handle = receipt_handle(request.receipt_handle)
            invisible_ms = _invisible_ms(request.invisible_duration)
            response = await self.invoke(caller, RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
                                         ChangeInvisibleTimeRequestHeader(
                                             consumer_group=group, topic=topic, queue_id=handle.queue_id,
                                             extra_info=request.receipt_handle, offset=handle.queue_offset,
                                             invisible_time=invisible_ms))
            changed = ChangeInvisibleTimeResponseHeader.from_fields(response.fields)
            return spb.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=changed.extra_info)
        return await self.guarded(context, spb.ChangeInvisibleDurationResponse, run)

    async def ForwardMessageToDeadLetterQueue(
            self, request: spb.ForwardMessageToDeadLetterQueueRequest,
            context: Context) -> spb.ForwardMessageToDeadLetterQueueResponse:
        """The consumer gives up on the message (a FIFO push consumer past its attempts): acked and
        copied to `%DLQ%<group>`; INVALID_RECEIPT_HANDLE when the handle is not current. Allowed
        to whoever may ack it (the ACK_MESSAGE ACL)."""
        async def run(caller: Caller) -> spb.ForwardMessageToDeadLetterQueueResponse:
            group = resource_name(request.group, "group")
            topic = resource_name(request.topic, "topic")
            handle = receipt_handle(request.receipt_handle)
            header = AckMessageRequestHeader(consumer_group=group, topic=topic, queue_id=handle.queue_id,
                                             extra_info=request.receipt_handle, offset=handle.queue_offset)
            self.auth.authorize(remoting_request(RequestCode.ACK_MESSAGE, header), caller.peer, caller.user)
            pop = self.parts.pop_service
            if pop is None:
                raise GrpcError(pb.INTERNAL_SERVER_ERROR, "the broker is not ready")
            if not pop.forward_to_dlq(group, topic, handle.queue_id, handle.queue_offset, handle.ck_id,
                                      request.delivery_attempt):
                raise GrpcError(pb.INVALID_RECEIPT_HANDLE, "the receipt handle is no longer current")
            return spb.ForwardMessageToDeadLetterQueueResponse(status=ok())
        return await self.guarded(context, spb.ForwardMessageToDeadLetterQueueResponse, run)
