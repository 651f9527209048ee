"""`ClientAPI`: the only client code that knows request codes (ARCHITECTURE.md client/api.py).

Each method sends one request to a broker address and returns typed values, or raises the
`ResponseError` subclass of the response code (`protocol.errors.error_for`), `RequestTimeout` or
`ConnectionClosed`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from client.remoting.remoting_client import RemotingClient
from protocol.bodies import (
    CheckClientRequestBody,
    ClusterInfo,
    ConsumerListBody,
    HeartbeatData,
    LockBatchBody,
    LockBatchResponseBody,
    TopicList,
    TopicRouteData,
    decode_batch_ack_result,
    decode_body,
    encode_body,
)
from protocol.codes import Perm, RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import MissingHeaderField, error_for
from protocol.headers import (
    ConsumerGroupRequestHeader,
    CreateSubscriptionGroupRequestHeader,
    CreateTopicRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetRouteInfoRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    SendBatchMessageRequestHeader,
    SendBatchMessageResponseHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    TopicQueueRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageByIdRequestHeader,
)
from protocol.headers_v5 import EndTransactionBatchRequestHeader, EndTransactionRequestHeader
from protocol.message import PROPERTY_UNIQ_KEY, MessageExt, decode_message_batch
from protocol.model import MessageQueue, PullStatus
from protocol.transaction import EndEntry, encode_end_batch

DEFAULT_TIMEOUT_MS = 3_000
_SEND_MESSAGE = int(RequestCode.SEND_MESSAGE)
_CONSUMER_SEND_MSG_BACK = int(RequestCode.CONSUMER_SEND_MSG_BACK)


class SendStatus(Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


@dataclass(frozen=True, slots=True)
class SendResult:
    """Outcome of a send: `msg_id` is the broker's offset message id; `queue_offset` the first
    message's queue offset; a batch also lists every `msg_ids`."""

    status: SendStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    topic: str = ""
    broker_name: str = ""
    msg_ids: tuple[str, ...] = ()
    uniq_keys: tuple[str, ...] = ()


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = 0


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def _pull_result(status: PullStatus, fields: dict[str, Any], messages: list[MessageExt]) -> PullResult:
    """A pull response's `PullMessageResponseHeader` read straight from its `ext` map (every pull
    does this); anything but four ints goes through `from_fields`, which raises what is wrong."""
    next_begin_offset, min_offset = fields.get("next_begin_offset"), fields.get("min_offset")
    max_offset, broker_id = fields.get("max_offset"), fields.get("suggest_which_broker_id", 0)
    if not (type(next_begin_offset) is int and type(min_offset) is int and type(max_offset) is int
            and type(broker_id) is int):
        h = PullMessageResponseHeader.from_fields(fields)
        next_begin_offset, min_offset, max_offset, broker_id = \
            h.next_begin_offset, h.min_offset, h.max_offset, h.suggest_which_broker_id
    return PullResult(status, next_begin_offset, min_offset, max_offset, messages, broker_id)


def _ok(response: RemotingCommand) -> RemotingCommand:
    if response.code != ResponseCode.SUCCESS:
        raise error_for(response.code, response.remark)
    return response


_SUCCESS = int(ResponseCode.SUCCESS)
_SEND_OK = SendStatus.SEND_OK     # module constants: an enum member lookup costs ~50 ns, paid on every send


def send_message_fields(producer_group: str, topic: str, queue_id: int, flag: int, born_timestamp: int,
                        properties: dict[str, str]) -> dict[str, Any]:
    """`SendMessageRequestHeader(...).to_fields()` of a first send (no reconsume), written out:
    the same keys in the same order, so the same bytes on the wire, without the dataclass."""
    return {"producer_group": producer_group, "topic": topic, "queue_id": queue_id, "flag": flag,
            "born_timestamp": born_timestamp, "properties": properties, "reconsume_times": 0,
            "max_reconsume_times": None}


def send_back_fields(commit_log_offset: int, group: str, delay_level: int, origin_msg_id: str, origin_topic: str,
                     max_reconsume_times: int) -> dict[str, Any]:
    """`ConsumerSendMsgBackRequestHeader(...).to_fields()` written out as `send_message_fields`
    is: the same keys in the same order, so the same bytes on the wire, without the dataclass."""
    return {"commit_log_offset": commit_log_offset, "group": group, "delay_level": delay_level,
            "origin_msg_id": origin_msg_id, "origin_topic": origin_topic, "max_reconsume_times": max_reconsume_times}


def _send_result(response: RemotingCommand, topic: str, broker_name: str = "",
                 uniq_keys: tuple[str, ...] = ()) -> SendResult:
    """The `SendResult` of a SEND_MESSAGE response: SUCCESS is SEND_OK, FLUSH_DISK_TIMEOUT with
    the send's header is FLUSH_DISK_TIMEOUT (stored, not yet on disk: RocketMQ's result, not
    resent), without one (a failed fsync) raises `FlushDiskTimeout`; any other code raises its
    `ResponseError`.

    The three fields of the usual answer are read by hand (every send decodes one); anything
    else goes through `SendMessageResponseHeader.from_fields`, which raises `MissingHeaderField`
    naming what is missing or mistyped, exactly as before the shortcut."""
    code = response.code
    if code == _SUCCESS:
        status = _SEND_OK
    elif code == ResponseCode.FLUSH_DISK_TIMEOUT and "msg_id" in response.fields:
        status = SendStatus.FLUSH_DISK_TIMEOUT
    else:
        raise error_for(code, response.remark)
    fields = response.fields
    msg_id, queue_id, queue_offset = fields.get("msg_id"), fields.get("queue_id"), fields.get("queue_offset")
    if type(msg_id) is not str or type(queue_id) is not int or type(queue_offset) is not int:
        header = SendMessageResponseHeader.from_fields(fields)
        msg_id, queue_id, queue_offset = header.msg_id, header.queue_id, header.queue_offset
    # status, msg_id, queue_id, queue_offset, topic, broker_name, msg_ids, uniq_keys (positional:
    # keywords cost a frozen dataclass's __init__ another ~0.15 µs)
    return SendResult(status, msg_id, queue_id, queue_offset, topic, broker_name, (msg_id,), uniq_keys)


_JUST_STR = frozenset({str})


def _batch_result(fields: dict[str, Any], topic: str, broker_name: str, uniq_keys: tuple[str, ...]) -> SendResult:
    """The `SendResult` of a SEND_BATCH_MESSAGE response's fields. The usual answer (a list of
    string ids, int queue id and offset) is read by hand; anything else goes through
    `SendBatchMessageResponseHeader.from_fields` (its per-item conversion cost ~15 µs a batch of
    32), which raises `MissingHeaderField` naming what is missing or mistyped."""
    msg_ids, queue_id, queue_offset = fields.get("msg_ids"), fields.get("queue_id"), fields.get("queue_offset")
    if (type(msg_ids) is not list or type(queue_id) is not int or type(queue_offset) is not int
            or not set(map(type, msg_ids)) <= _JUST_STR):
        header = SendBatchMessageResponseHeader.from_fields(fields)
        msg_ids, queue_id, queue_offset = header.msg_ids, header.queue_id, header.queue_offset
    ids = tuple(msg_ids)
    return SendResult(_SEND_OK, ids[0] if ids else "", queue_id, queue_offset, topic, broker_name, ids, uniq_keys)


SEND_BACK_TIMEOUT_MS = 5_000


class ClientAPI:
    def __init__(self, remoting: RemotingClient) -> None:
        self.remoting = remoting

    async def _call(self, address: str, cmd: RemotingCommand, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> RemotingCommand:
        return _ok(await self.remoting.invoke(address, cmd, timeout_ms))

    # -- producing ---------------------------------------------------------------------------------

    async def send_message(self, address: str, header: SendMessageRequestHeader, body: bytes,
                           timeout_ms: int = DEFAULT_TIMEOUT_MS) -> SendResult:
        response = await self.remoting.invoke(address, request(RequestCode.SEND_MESSAGE, header, body), timeout_ms)
        return _send_result(response, header.topic)

    async def send_message_to(self, address: str, mq: MessageQueue, producer_group: str, body: bytes,
                              properties: dict[str, str], flag: int = 0,
                              timeout_ms: int = DEFAULT_TIMEOUT_MS) -> SendResult:
        """SEND_MESSAGE of one message to `mq`, born now: `send_message` with the header's fields
        written straight into the request (the wire map is the same, key for key), and a result
        that names `mq.broker_name` and the message's UNIQ_KEY. The producer's path: building a
        `SendMessageRequestHeader`, then `to_fields`, then a second `SendResult`, cost ~2 µs of
        a send's ~16 µs of client CPU."""
        fields = send_message_fields(producer_group, mq.topic, mq.queue_id, flag, time.time_ns() // 1_000_000,
                                     properties)
        cmd = RemotingCommand(_SEND_MESSAGE, fields=fields, body=body)
        response = await self.remoting.invoke(address, cmd, timeout_ms)
        uniq_key = properties.get(PROPERTY_UNIQ_KEY)
        return _send_result(response, mq.topic, mq.broker_name, (uniq_key,) if uniq_key is not None else ())

    async def send_batch(self, address: str, header: SendBatchMessageRequestHeader, body: bytes,
                         timeout_ms: int = DEFAULT_TIMEOUT_MS, *, broker_name: str = "",
                         uniq_keys: tuple[str, ...] = ()) -> SendResult:
        """SEND_BATCH_MESSAGE; the result names `broker_name` and carries `uniq_keys` as given."""
        response = await self._call(address, request(RequestCode.SEND_BATCH_MESSAGE, header, body), timeout_ms)
        return _batch_result(response.fields, header.topic, broker_name, uniq_keys)

    async def end_transaction(self, address: str, header: EndTransactionRequestHeader,
                              timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """END_TRANSACTION; raises the broker's refusal (`SystemError_` for an unknown or resolved
        half message)."""
        await self._call(address, request(RequestCode.END_TRANSACTION, header), timeout_ms)

    async def end_transaction_batch(self, address: str, producer_group: str, entries: Sequence[EndEntry],
                                    timeout_ms: int = DEFAULT_TIMEOUT_MS) -> tuple[list[int], list[str]]:
        """END_TRANSACTION_BATCH (ours): END_TRANSACTION of each entry; (codes, remarks), one per
        entry in order (0 SUCCESS). Raises the broker's refusal of the whole request, and
        `MissingHeaderField` for an answer whose entry count differs."""
        header = EndTransactionBatchRequestHeader(producer_group=producer_group)
        cmd = request(RequestCode.END_TRANSACTION_BATCH, header, encode_end_batch(entries))
        codes, remarks = decode_batch_ack_result((await self._call(address, cmd, timeout_ms)).body_bytes())
        if len(codes) != len(entries) or len(remarks) != len(entries):
            raise MissingHeaderField("body", f"{len(entries)} codes and remarks", codes)
        return codes, remarks

    # -- consuming ---------------------------------------------------------------------------------

    async def pull_message(self, address: str, header: PullMessageRequestHeader, timeout_ms: int) -> PullResult:
        """One PULL_MESSAGE; response codes map to `PullStatus` as RocketMQ's
        `MQClientAPIImpl.processPullResponse` (§2.3); any other code raises its `ResponseError`."""
        response = await self.remoting.invoke(address, request(RequestCode.PULL_MESSAGE, header), timeout_ms)
        status = _PULL_STATUS.get(response.code)  # type: ignore[call-overload]
        if status is None:
            raise error_for(response.code, response.remark)
        messages = decode_message_batch(response.body_bytes()) if status is PullStatus.FOUND and response.body else []
        return _pull_result(status, response.fields, messages)

    async def pull_message_raw(self, address: str, header: PullMessageRequestHeader,
                               timeout_ms: int) -> tuple[PullResult, bytes]:
        """`pull_message` with the body's messages left encoded (PROTOCOL.md "Messages in a body"):
        the result has no `messages`, the body comes beside it (b"" unless FOUND). For readers
        that decode straight into columns (the Spark source)."""
        response = await self.remoting.invoke(address, request(RequestCode.PULL_MESSAGE, header), timeout_ms)
        status = _PULL_STATUS.get(response.code)  # type: ignore[call-overload]
        if status is None:
            raise error_for(response.code, response.remark)
        body = response.body_bytes() if status is PullStatus.FOUND else b""
        return _pull_result(status, response.fields, []), body

    async def consumer_send_msg_back(self, address: str, message: MessageExt, consumer_group: str,
                                     delay_level: int, max_reconsume_times: int,
                                     timeout_ms: int = SEND_BACK_TIMEOUT_MS) -> None:
        """CONSUMER_SEND_MSG_BACK of `message` (found by its `commit_log_offset`) for
        `consumer_group`: the broker stores it again in `%RETRY%<group>` with `delay_level` (0:
        `3 + reconsume_times`) or in `%DLQ%<group>` once `reconsume_times` reaches
        `max_reconsume_times`. Raises the response's `ResponseError`, `RequestTimeout` or
        `ConnectionClosed`. RocketMQ `MQClientAPIImpl#consumerSendMessageBack` (5 s timeout)."""
        fields = send_back_fields(message.commit_log_offset, consumer_group, delay_level, message.msg_id,
                                  message.topic, max_reconsume_times)
        await self._call(address, RemotingCommand(_CONSUMER_SEND_MSG_BACK, fields=fields), timeout_ms)

    async def send_heartbeat(self, address: str, data: HeartbeatData, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        await self._call(address, request(RequestCode.HEART_BEAT, body=encode_body(data)), timeout_ms)

    async def check_client_config(self, address: str, body: CheckClientRequestBody,
                                  timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """CHECK_CLIENT_CONFIG: returns when the broker can serve the subscription; raises
        `SubscriptionParseFailed` when its expression does not compile, `SystemError_` when SQL92
        is disabled there."""
        await self._call(address, request(RequestCode.CHECK_CLIENT_CONFIG, body=encode_body(body)), timeout_ms)

    async def unregister_client(self, address: str, client_id: str, *, producer_group: str | None = None,
                                consumer_group: str | None = None, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        header = UnregisterClientRequestHeader(client_id=client_id, producer_group=producer_group,
                                               consumer_group=consumer_group)
        await self._call(address, request(RequestCode.UNREGISTER_CLIENT, header), timeout_ms)

    async def get_consumer_id_list(self, address: str, consumer_group: str,
                                   timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[str]:
        response = await self._call(address, request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                      ConsumerGroupRequestHeader(consumer_group=consumer_group)),
                                    timeout_ms)
        return decode_body(ConsumerListBody, response.body_bytes()).consumer_id_list

    async def query_consumer_offset(self, address: str, consumer_group: str, topic: str, queue_id: int,
                                    timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
        """The committed offset; raises `QueryNotFound` when the broker has none to give."""
        header = QueryConsumerOffsetRequestHeader(consumer_group=consumer_group, topic=topic, queue_id=queue_id)
        response = await self._call(address, request(RequestCode.QUERY_CONSUMER_OFFSET, header), timeout_ms)
        return OffsetResponseHeader.from_fields(response.fields).offset

    async def update_consumer_offset(self, address: str, consumer_group: str, topic: str, queue_id: int,
                                     commit_offset: int, *, oneway: bool = False,
                                     timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        header = UpdateConsumerOffsetRequestHeader(consumer_group=consumer_group, topic=topic, queue_id=queue_id,
                                                   commit_offset=commit_offset)
        cmd = request(RequestCode.UPDATE_CONSUMER_OFFSET, header)
        if oneway:
            await self.remoting.invoke_oneway(address, cmd)
        else:
            await self._call(address, cmd, timeout_ms)

    async def lock_batch_mq(self, address: str, consumer_group: str, client_id: str,
                            queues: Iterable[MessageQueue], timeout_ms: int = DEFAULT_TIMEOUT_MS) -> set[MessageQueue]:
        """LOCK_BATCH_MQ: the subset of `queues` the broker now locks for `client_id` (granted or
        refreshed); the rest are held by another live client."""
        body = LockBatchBody(consumer_group=consumer_group, client_id=client_id,
                             mq_set=[(mq.topic, mq.broker_name, mq.queue_id) for mq in queues])
        response = await self._call(address, request(RequestCode.LOCK_BATCH_MQ, body=encode_body(body)), timeout_ms)
        granted = decode_body(LockBatchResponseBody, response.body_bytes()).lock_ok_mq_set
        return {MessageQueue(*mq) for mq in granted}

    async def unlock_batch_mq(self, address: str, consumer_group: str, client_id: str,
                              queues: Iterable[MessageQueue], *, oneway: bool = False,
                              timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        """UNLOCK_BATCH_MQ: release those of `queues` that `client_id` holds (RocketMQ sends it
        oneway when a queue is dropped)."""
        body = LockBatchBody(consumer_group=consumer_group, client_id=client_id,
                             mq_set=[(mq.topic, mq.broker_name, mq.queue_id) for mq in queues])
        cmd = request(RequestCode.UNLOCK_BATCH_MQ, body=encode_body(body), oneway=oneway)
        if oneway:
            await self.remoting.invoke_oneway(address, cmd)
        else:
            await self._call(address, cmd, timeout_ms)

    # -- queue facts ---------------------------------------------------------------------------------

    async def _queue_offset(self, code: RequestCode, address: str, topic: str, queue_id: int, timeout_ms: int) -> int:
        response = await self._call(address, request(code, TopicQueueRequestHeader(topic=topic, queue_id=queue_id)),
                                    timeout_ms)
        return OffsetResponseHeader.from_fields(response.fields).offset

    async def get_max_offset(self, address: str, topic: str, queue_id: int,
                             timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
        return await self._queue_offset(RequestCode.GET_MAX_OFFSET, address, topic, queue_id, timeout_ms)

    async def get_min_offset(self, address: str, topic: str, queue_id: int,
                             timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
        return await self._queue_offset(RequestCode.GET_MIN_OFFSET, address, topic, queue_id, timeout_ms)

    async def get_earliest_msg_storetime(self, address: str, topic: str, queue_id: int,
                                         timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
        response = await self._call(address, request(RequestCode.GET_EARLIEST_MSG_STORETIME,
                                                      TopicQueueRequestHeader(topic=topic, queue_id=queue_id)),
                                    timeout_ms)
        return GetEarliestMsgStoretimeResponseHeader.from_fields(response.fields).timestamp

    async def search_offset(self, address: str, topic: str, queue_id: int, timestamp_ms: int,
                            timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
        header = SearchOffsetRequestHeader(topic=topic, queue_id=queue_id, timestamp=timestamp_ms)
        response = await self._call(address, request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header), timeout_ms)
        return OffsetResponseHeader.from_fields(response.fields).offset

    async def view_message(self, address: str, msg_id: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> MessageExt:
        response = await self._call(address, request(RequestCode.VIEW_MESSAGE_BY_ID,
                                                      ViewMessageByIdRequestHeader(msg_id=msg_id)), timeout_ms)
        (message,) = decode_message_batch(response.body_bytes())
        return message

    # -- admin ---------------------------------------------------------------------------------------

    async def create_topic(self, address: str, topic: str, queue_nums: int = 4,
                           perm: int = Perm.READ | Perm.WRITE, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        header = CreateTopicRequestHeader(topic=topic, read_queue_nums=queue_nums, write_queue_nums=queue_nums,
                                          perm=perm)
        await self._call(address, request(RequestCode.UPDATE_AND_CREATE_TOPIC, header), timeout_ms)

    async def get_broker_cluster_info(self, address: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO: a name server's brokers by name and cluster (a broker answers
        with itself)."""
        response = await self._call(address, request(RequestCode.GET_BROKER_CLUSTER_INFO), timeout_ms)
        return decode_body(ClusterInfo, response.body_bytes())

    async def get_all_topic_list(self, address: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER: every topic a name server's live brokers serve."""
        response = await self._call(address, request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), timeout_ms)
        return decode_body(TopicList, response.body_bytes()).topic_list

    async def get_route_info(self, address: str, topic: str, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> TopicRouteData:
        response = await self._call(address, request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                      GetRouteInfoRequestHeader(topic=topic)), timeout_ms)
        return decode_body(TopicRouteData, response.body_bytes())

    async def create_subscription_group(self, address: str, header: CreateSubscriptionGroupRequestHeader,
                                        timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        await self._call(address, request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, header), timeout_ms)


