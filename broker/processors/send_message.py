"""SEND_MESSAGE and SEND_BATCH_MESSAGE → `MessageStore.put_message(s)`.

In SYNC_FLUSH (the default) the response is written after an fsync that covers the record
(group commit); a flush slower than `sync_flush_timeout_ms` is answered FLUSH_DISK_TIMEOUT."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import msgpack

from broker.processors.validate import require_group_name, require_topic_name
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.store.results import FlushDiskTimeoutError, PutMessageResult, PutMessageStatus
from broker.topics.topic_config_manager import TopicConfigManager
from protocol.command import RemotingCommand
from protocol.errors import FlushDiskTimeout, MessageIllegal, SystemError_
from protocol.headers import (
    SendBatchMessageRequestHeader,
    SendBatchMessageResponseHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from protocol.message import make_msg_id, msg_id_prefix

MessagesIn = Callable[[str, int, int], None]   # (topic, message count, bytes)
MAX_BATCH_MESSAGES = 1024


class SendMessageProcessor:
    def __init__(self, store: MessageStore, topics: TopicConfigManager, store_host: str,
                 max_message_bytes: int, on_stored: MessagesIn) -> None:
        self._store, self._topics, self._store_host = store, topics, store_host
        self._max_message_bytes = max_message_bytes
        self._on_stored = on_stored

    async def process(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = SendMessageRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        require_group_name(header.producer_group)
        body = request.body_bytes()
        if len(body) > self._max_message_bytes:
            raise MessageIllegal(f"message body of {len(body)} bytes exceeds max_message_bytes "
                                 f"{self._max_message_bytes}")
        self._topics.for_send(header.topic, header.queue_id)
        result = self._store.put_message(
            topic=header.topic, queue_id=header.queue_id, body=body, properties=header.properties,
            flag=header.flag, born_timestamp=header.born_timestamp, born_host=ctx.client_addr,
            reconsume_times=header.reconsume_times)
        await self._acknowledge(result)
        self._on_stored(header.topic, 1, len(body))
        return request.response(header=SendMessageResponseHeader(
            msg_id=make_msg_id(self._store_host, result.commit_log_offsets[0]),
            queue_id=header.queue_id, queue_offset=result.queue_offset))

    async def process_batch(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = SendBatchMessageRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        require_group_name(header.producer_group)
        messages, body_bytes = self._decode_batch(request.body_bytes())
        self._topics.for_send(header.topic, header.queue_id)
        result = self._store.put_messages(topic=header.topic, queue_id=header.queue_id, messages=messages,
                                          born_timestamp=header.born_timestamp, born_host=ctx.client_addr)
        await self._acknowledge(result)
        self._on_stored(header.topic, len(messages), body_bytes)
        prefix = msg_id_prefix(self._store_host)
        return request.response(header=SendBatchMessageResponseHeader(
            msg_ids=[prefix + f"{o:016X}" for o in result.commit_log_offsets],
            queue_id=header.queue_id, queue_offset=result.queue_offset))

    def _decode_batch(self, raw: bytes) -> tuple[list[tuple[dict[str, str], int, bytes]], int]:
        """The batch's (properties, flag, body) items and their total body bytes; raises
        `MessageIllegal` naming the first bad item."""
        try:
            value: Any = msgpack.unpackb(raw, raw=False)
        except Exception as exc:
            raise MessageIllegal(f"batch body is not msgpack: {exc.__class__.__name__}") from None
        if not isinstance(value, list) or not value:
            raise MessageIllegal("batch body must be a non-empty array of [properties, flag, body]")
        if len(value) > MAX_BATCH_MESSAGES:
            raise MessageIllegal(f"a batch holds at most {MAX_BATCH_MESSAGES} messages, got {len(value)}")
        max_bytes = self._max_message_bytes
        body_bytes = 0
        for i, item in enumerate(value):       # a tight loop: this runs for every batched message
            if type(item) is not list or len(item) != 3:
                raise MessageIllegal(f"batch message {i} must be [map str→str, int, bin]")
            properties, flag, body = item
            if type(properties) is not dict or type(flag) is not int or type(body) is not bytes:
                raise MessageIllegal(f"batch message {i} must be [map str→str, int, bin]")
            for key, text in properties.items():
                if type(key) is not str or type(text) is not str:
                    raise MessageIllegal(f"batch message {i} must be [map str→str, int, bin]")
            if len(body) > max_bytes:
                raise MessageIllegal(f"batch message {i} body of {len(body)} bytes exceeds "
                                     f"max_message_bytes {max_bytes}")
            body_bytes += len(body)
        # Each item is a 3-element list; the store unpacks it like the tuple it is typed as.
        return cast(list[tuple[dict[str, str], int, bytes]], value), body_bytes

    async def _acknowledge(self, result: PutMessageResult) -> None:
        if result.status is PutMessageStatus.MESSAGE_ILLEGAL:
            raise MessageIllegal("message refused by the store (size or properties)")
        if result.status is not PutMessageStatus.PUT_OK:
            raise SystemError_(f"store refused the message: {result.status.name}")
        try:
            await self._store.wait_flushed(result.end_offset)
        except FlushDiskTimeoutError as exc:
            raise FlushDiskTimeout(str(exc)) from None
