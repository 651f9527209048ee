"""END_TRANSACTION (37) → `TransactionBridge.end` (RocketMQ `EndTransactionProcessor`).

Answered as soon as the commit's records are written, not after their fsync: RocketMQ's producers
send it one-way and never wait; ours wait for the answer (so a refusal reaches them) but not for the
disk. What is written survives a kill -9 (it is in the page cache); on a power loss before the
fsync the half message is pending again after the restart and its check-back decides it once more
(the op record follows the real message in the commit log, so it is never durable without it)."""

from __future__ import annotations

from broker.remoting.context import RequestContext
from broker.transaction.bridge import TransactionBridge
from protocol.command import RemotingCommand
from protocol.errors import MessageIllegal
from protocol.headers import INT32_MAX, INT32_MIN, INT64_MAX
from protocol.headers_v5 import EndTransactionRequestHeader


class EndTransactionProcessor:
    """Refusals, each answered with nothing changed: a body (END_TRANSACTION takes none:
    MESSAGE_ILLEGAL), a mistyped or out-of-range field (an offset outside 0..2**63-1, a
    `commit_or_rollback` outside int32: MESSAGE_ILLEGAL / SYSTEM_ERROR naming the field), and the
    bridge's SYSTEM_ERRORs (unknown or resolved half, wrong group, topic or offsets)."""

    def __init__(self, bridge: TransactionBridge) -> None:
        self._bridge = bridge

    def process(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """The usual request (no body, every field of its exact type and in range) is read from
        the `ext` map directly, as the usual send is; anything else takes the typed header, whose
        errors the protocol names."""
        fields = request.fields
        group, topic, action = fields.get("producer_group"), fields.get("topic"), fields.get("commit_or_rollback")
        half_offset, commit_log_offset = fields.get("tran_state_table_offset"), fields.get("commit_log_offset")
        msg_id, transaction_id = fields.get("msg_id"), fields.get("transaction_id")
        if (request.body or type(group) is not str or type(topic) is not str or type(action) is not int
                or type(half_offset) is not int or type(commit_log_offset) is not int
                or not 0 <= half_offset <= INT64_MAX or not 0 <= commit_log_offset <= INT64_MAX
                or not INT32_MIN <= action <= INT32_MAX
                or type(fields.get("from_transaction_check", False)) is not bool
                or (msg_id is not None and type(msg_id) is not str)
                or (transaction_id is not None and type(transaction_id) is not str)):
            return self._process_typed(request)
        self._bridge.resolve(group, topic, half_offset, commit_log_offset, action)
        return request.response()

    def _process_typed(self, request: RemotingCommand) -> RemotingCommand:
        body = request.body_bytes()
        if body:
            raise MessageIllegal(f"END_TRANSACTION takes no body, got {len(body)} bytes")
        header = EndTransactionRequestHeader.from_fields(request.fields)
        self._bridge.end(header)
        return request.response()
