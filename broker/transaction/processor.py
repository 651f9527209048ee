"""END_TRANSACTION (37) → `TransactionBridge.end` (RocketMQ `EndTransactionProcessor`), and
END_TRANSACTION_BATCH (700037, ours): many of them in one request, each answered on its own.

Answered as soon as the commit's records are written, not after their fsync: RocketMQ's producers
send it one-way and never wait; ours do not wait either but read the answer in the background (so a
refusal is logged), and wait for the answers still due when they stop; the broker does not wait for
the disk. What is written survives a kill -9 (it is in the page cache); on a power loss before the
fsync the half message is pending again after the restart and its check-back decides it once more
(the op record follows the real message in the commit log, so it is never durable without it)."""

from __future__ import annotations

from broker.remoting.context import RequestContext
from broker.transaction.bridge import TransactionBridge
from protocol.bodies import encode_batch_ack_result
from protocol.command import RemotingCommand
from protocol.errors import MessageIllegal, ResponseError, SystemError_
from protocol.headers import INT32_MAX, INT32_MIN, INT64_MAX
from protocol.headers_v5 import EndTransactionBatchRequestHeader, EndTransactionRequestHeader
from protocol.transaction import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, decode_end_batch


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


class EndTransactionBatchProcessor:
    """END_TRANSACTION_BATCH: each entry of the body resolved as END_TRANSACTION would resolve it,
    answered SUCCESS with one (code, remark) per entry, in order (`BatchAckResultBody`'s shape):
    an entry END_TRANSACTION would refuse (unknown or resolved half, wrong group, topic or
    offsets, a half named twice in the batch, a real topic gone) gets that refusal's code and
    changes nothing; the others are resolved. The commits of one real queue (and origin) are
    written as one append, then the op record of the whole batch (`TransactionBridge.flush_ops`)
    before the answer: a kill -9 once the answer is out does not bring them back. Refused whole,
    with nothing changed: a malformed body (`decode_end_batch`: more than 1,024 entries, not
    msgpack, a mistyped entry, an offset out of range: MESSAGE_ILLEGAL) or header (SYSTEM_ERROR)."""

    def __init__(self, bridge: TransactionBridge) -> None:
        self._bridge = bridge

    def process(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        group = EndTransactionBatchRequestHeader.from_fields(request.fields).producer_group
        entries = decode_end_batch(request.body_bytes())
        bridge = self._bridge
        codes, remarks = [0] * len(entries), [""] * len(entries)
        # commits by (real topic, queue id, origin): each run is one append
        runs: dict[tuple[str, int, tuple[int, str, int]], list[tuple[int, dict[str, str], int, bytes]]] = {}
        run_entries: dict[tuple[str, int, tuple[int, str, int]], list[int]] = {}
        named: set[int] = set()
        checked: set[tuple[str, int]] = set()       # real queues that took a send just now
        for index, (topic, half_offset, commit_log_offset, action, _) in enumerate(entries):
            try:
                if half_offset in named:
                    raise SystemError_(f"transaction offset {half_offset} is named twice in this batch: "
                                       f"the later entry changed nothing")
                named.add(half_offset)
                _, properties, flag, body, origin = bridge.validate(group, topic, half_offset, commit_log_offset,
                                                                    action)
                if action == TRANSACTION_COMMIT_TYPE:
                    real_topic, queue_id, real_properties = bridge.real_message(properties, checked)
                    key = (real_topic, queue_id, origin)
                    runs.setdefault(key, []).append((half_offset, real_properties, flag, body))
                    run_entries.setdefault(key, []).append(index)
                elif action == TRANSACTION_ROLLBACK_TYPE:
                    bridge.roll_back(half_offset)
            except ResponseError as exc:
                codes[index], remarks[index] = int(exc.code), exc.remark
        for key, run in runs.items():
            try:
                bridge.commit_run(key[0], key[1], key[2], run)
            except ResponseError as exc:
                for index in run_entries[key]:
                    codes[index], remarks[index] = int(exc.code), exc.remark
        bridge.flush_ops()      # the batch's one op record, before its answer (after its commits)
        return request.response(body=encode_batch_ack_result(codes, remarks))
