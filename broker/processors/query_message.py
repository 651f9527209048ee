"""QUERY_MESSAGE (RocketMQ `QueryMessageProcessor`): messages of a topic by key (a word of KEYS, or
the UNIQ_KEY), newest first, from the store's key index; QUERY_NOT_FOUND when there is none."""

from __future__ import annotations

from broker.processors.validate import require_topic_name
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from protocol.command import RemotingCommand
from protocol.errors import QueryNotFound, SystemError_
from protocol.headers import QueryMessageRequestHeader

MAX_QUERY_MESSAGES = 64


class QueryMessageProcessor:
    def __init__(self, store: MessageStore) -> None:
        self._store = store

    async def query_message(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        header = QueryMessageRequestHeader.from_fields(request.fields)
        require_topic_name(header.topic)
        if not header.key:
            raise SystemError_("key must not be empty")
        max_num = min(max(header.max_num, 1), MAX_QUERY_MESSAGES)
        payloads = self._store.query_by_key(header.topic, header.key, max_num, header.begin_timestamp,
                                            header.end_timestamp)
        if not payloads:
            raise QueryNotFound(f"no message of topic {header.topic!r} has key {header.key!r}")
        return request.response(body=payloads)
