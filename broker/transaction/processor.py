"""END_TRANSACTION (37) → `TransactionBridge.end` (RocketMQ `EndTransactionProcessor`), answered
once what it wrote is durable (as a send is). RocketMQ's producers send it one-way; ours wait for
the answer, so a refusal reaches them; a one-way one is handled the same, its answer dropped."""

from __future__ import annotations

from broker.processors.send_message import Answer, answer_when_durable
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.transaction.bridge import TransactionBridge
from protocol.command import RemotingCommand
from protocol.errors import MessageIllegal
from protocol.headers import EndTransactionRequestHeader


class EndTransactionProcessor:
    """Refusals, each answered with nothing changed: a body (END_TRANSACTION takes none:
    MESSAGE_ILLEGAL), a mistyped or out-of-range field (an offset outside 0..2**63-1, a
    `commit_or_rollback` outside int32: MESSAGE_ILLEGAL / SYSTEM_ERROR naming the field), and the
    bridge's SYSTEM_ERRORs (unknown or resolved half, wrong group, topic or offsets)."""

    def __init__(self, bridge: TransactionBridge, store: MessageStore) -> None:
        self._bridge, self._store = bridge, store

    def process(self, ctx: RequestContext, request: RemotingCommand) -> Answer:
        body = request.body_bytes()
        if body:
            raise MessageIllegal(f"END_TRANSACTION takes no body, got {len(body)} bytes")
        header = EndTransactionRequestHeader.from_fields(request.fields)
        end_offset = self._bridge.end(header)
        response = request.response()
        if end_offset == 0:
            return response
        return answer_when_durable(self._store, end_offset, response)
