"""`TransactionProducer` (RocketMQ `TransactionMQProducer`): a message published only if the local
transaction commits.

    class Listener:
        def execute_local_transaction(self, message, arg) -> LocalTransactionState: ...
        async def check_local_transaction(self, message_ext) -> LocalTransactionState: ...

    async with TransactionProducer("pg", "127.0.0.1:10911", Listener()) as producer:
        result = await producer.send_message_in_transaction(Message("orders", b"..."), arg)

`send_message_in_transaction` sends a half message (TRAN_MSG, invisible to consumers), runs
`execute_local_transaction`, then ends the transaction (END_TRANSACTION: commit writes the message
to its topic, rollback discards it, UNKNOW leaves it to the broker's check-back). A half message
left unresolved is checked back (CHECK_TRANSACTION_STATE) on a live producer of the group, which
answers with `check_local_transaction`. Listener methods may be plain (run in a worker thread, off
the event loop) or `async def` (awaited on it); one raising, or returning something other than a
`LocalTransactionState`, counts as UNKNOW (as RocketMQ logs and treats a thrown exception).

Concurrent transactions share requests (`Coalescer`, issue #38): the half messages of one topic
sent in the same event-loop step go as one SEND_BATCH_MESSAGE (each keeps its own UNIQ_KEY, its
transaction id, and gets its own half offset), and the ends to one broker resolved in the same
step as one END_TRANSACTION_BATCH with a result per transaction; a lone transaction goes out as
before, one loop iteration later. A batch the broker refuses as MESSAGE_ILLEGAL (one message over
a limit) is sent again one message at a time, so only that message's caller gets the error; one
answered FLUSH_DISK_TIMEOUT raises `FlushDiskTimeout` to each caller (the halves stay pending and
are checked back), where a lone half answered so is rolled back at once.

The end is sent without waiting for its answer, like RocketMQ's one-way END_TRANSACTION
(`endTransactionOneway`): `send_message_in_transaction` returns once the end is handed to the
coalescer, and the answer arrives in the background. Where we differ from RocketMQ: the end is
still a request, so a refusal (or no answer within `send_msg_timeout_ms`) is logged with its reason
(the broker's check-back resolves the transaction, as for a lost one-way end); `shutdown` waits for
the ends not yet answered (up to `send_msg_timeout_ms`), so a stop right after sends drops none; at
most `MAX_UNANSWERED_ENDS` wait for their answer (RocketMQ's one-way semaphore), past that a caller
waits for its own end's answer; UNKNOW sends nothing (RocketMQ sends a one-way "not type" the
broker ignores); a check for a transaction whose previous check is still running here is ignored,
so a listener slower than the check interval runs once per transaction at a time."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from client.api import SendStatus
from client.errors import ClientStateError
from client.producer.coalescer import Coalescer
from client.producer.producer import Producer
from protocol.channel import Channel
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import MessageIllegal, MissingHeaderField, MQError, error_for
from protocol.headers_v5 import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from protocol.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
    MessageExt,
    decode_message_batch,
    msg_id_commit_log_offset,
    msg_id_commit_log_offsets,
)
from protocol.model import MessageQueue
from protocol.transaction import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    EndEntry,
    LocalTransactionState,
)

log = logging.getLogger(__name__)
HALF_BATCH_MAX_MESSAGES = 64            # half messages in one SEND_BATCH_MESSAGE (more: less pipelining)
HALF_BATCH_MAX_BYTES = 1024 * 1024      # their bodies' bytes (a run is cut before it passes this)
END_BATCH_MAX_ENTRIES = 1024            # ends in one END_TRANSACTION_BATCH (the broker's bound)
MAX_CACHED_QUEUES = 4096                # results' MessageQueue objects kept to be shared (immutable)
MAX_UNANSWERED_ENDS = 65_535            # ends sent and not yet answered (RocketMQ's clientOnewaySemaphoreValue)
Sent = tuple[SendStatus, str, int, int, str, str, int]
"""A half message's send: (status, msg_id, queue_id, queue_offset (its half offset), broker_name,
transaction_id (its UNIQ_KEY), commit_log_offset (msg_id's))."""
_STATE_NAMES = {state.commit_or_rollback: state.name for state in LocalTransactionState}
_SEND_OK, _ROLLBACK, _UNKNOW = SendStatus.SEND_OK, LocalTransactionState.ROLLBACK_MESSAGE, LocalTransactionState.UNKNOW


class TransactionListener(Protocol):
    def execute_local_transaction(self, message: Message, arg: Any) -> Any: ...

    def check_local_transaction(self, message_ext: MessageExt) -> Any: ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """`msg_id`: the half message's offset id; `queue_offset`: its offset in the half queue (the
    broker's `tran_state_table_offset`); `message_queue`: the real topic's queue it goes to;
    `transaction_id`: the message's UNIQ_KEY (RocketMQ's transactionId)."""

    send_status: SendStatus
    msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    transaction_id: str
    local_transaction_state: LocalTransactionState


_new_object = object.__new__
_SET_STATUS, _SET_MSG_ID, _SET_QUEUE, _SET_OFFSET, _SET_TRANSACTION_ID, _SET_STATE = (
    TransactionSendResult.__dict__[name].__set__ for name in TransactionSendResult.__slots__)


def _send_result(status: SendStatus, msg_id: str, queue: MessageQueue, half_offset: int, transaction_id: str,
                 state: LocalTransactionState) -> TransactionSendResult:
    """`TransactionSendResult(...)`, its slots set through their descriptors: the frozen
    dataclass's own `__init__` (an `object.__setattr__` a field) costs ~0.4 µs more."""
    result = _new_object(TransactionSendResult)
    _SET_STATUS(result, status)
    _SET_MSG_ID(result, msg_id)
    _SET_QUEUE(result, queue)
    _SET_OFFSET(result, half_offset)
    _SET_TRANSACTION_ID(result, transaction_id)
    _SET_STATE(result, state)
    return result


_IS_ASYNC: dict[Any, bool] = {}        # listener function → `async def`? (inspect costs ~1 µs a call)


def _is_async(method: Callable[..., Any]) -> bool:
    function = getattr(method, "__func__", method)
    known = _IS_ASYNC.get(function)
    if known is None:
        known = inspect.iscoroutinefunction(method)
        if len(_IS_ASYNC) < 1024:
            _IS_ASYNC[function] = known
    return known


async def _decide(method: Callable[..., Any], *args: Any) -> LocalTransactionState:
    """Run a listener method (a plain one in a worker thread); UNKNOW if it raises or returns
    anything but a `LocalTransactionState`."""
    try:
        if _is_async(method):
            state = await method(*args)
        else:
            state = await asyncio.to_thread(method, *args)
            if inspect.isawaitable(state):
                state = await state
    except Exception:
        log.exception("transaction listener %s raised; taken as UNKNOW", getattr(method, "__name__", method))
        return LocalTransactionState.UNKNOW
    if not isinstance(state, LocalTransactionState):
        log.warning("transaction listener returned %r, not a LocalTransactionState; taken as UNKNOW", state)
        return LocalTransactionState.UNKNOW
    return state


class TransactionProducer(Producer):
    """`TransactionProducer(group, endpoints, listener, **options)`: `options` are `Producer`'s
    (`credentials=`, `tls=`, `ssl_context=`, `send_msg_timeout_ms=`, ...) plus
    `shutdown_timeout_ms` (5,000): how long `shutdown` waits for transactions and checks in flight.
    Raises `ClientStateError` for a send before `start()` or once `shutdown()` began, `ValueError`
    for a message with a delay level (a half message is not delayed, as RocketMQ 5)."""

    def __init__(self, producer_group: str, endpoints: str | Sequence[str], listener: TransactionListener, *,
                 shutdown_timeout_ms: int = 5_000, **options: Any) -> None:
        super().__init__(producer_group, endpoints, **options)
        self.listener = listener
        self.shutdown_timeout_ms = shutdown_timeout_ms
        self._closing = False
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        self._checking: set[tuple[str, int]] = set()
        self._check_tasks: set[asyncio.Task[None]] = set()
        self._unanswered = 0                # ends handed over, answer not yet in
        self._queues: dict[tuple[str, str, int], MessageQueue] = {}     # the results' queues, shared
        self._all_answered: asyncio.Event | None = None        # set when `_unanswered` drops to 0
        self._halves: Coalescer[str, Message, Sent] = Coalescer(
            self._send_halves, max_items=HALF_BATCH_MAX_MESSAGES, max_bytes=HALF_BATCH_MAX_BYTES,
            size=lambda half: len(half.body))
        self._ends: Coalescer[str, EndEntry, None] = Coalescer(
            self._send_ends, max_items=END_BATCH_MAX_ENTRIES, max_bytes=END_BATCH_MAX_ENTRIES, size=lambda _: 1,
            on_done=self._answered)

    async def start(self) -> None:
        if self._instance is not None:
            return
        self._closing = False
        await super().start()
        self._require_instance().transaction_checkers[self.producer_group] = self._on_check

    async def shutdown(self) -> None:
        """Take no more sends or checks, wait up to `shutdown_timeout_ms` for those in flight
        (cancelling checks still running then: the broker checks again) and up to
        `send_msg_timeout_ms` for the answers of ends already sent, then `Producer.shutdown`."""
        if self._instance is None:
            return
        self._closing = True
        if self._in_flight:
            self._idle = self._idle or asyncio.Event()
            try:
                async with asyncio.timeout(self.shutdown_timeout_ms / 1000):
                    await self._idle.wait()
            except TimeoutError:
                log.warning("%d transactions still running after %d ms; shutting down", self._in_flight,
                            self.shutdown_timeout_ms)
        if self._unanswered:
            self._all_answered = asyncio.Event()
            try:
                async with asyncio.timeout(self.send_msg_timeout_ms / 1000):
                    await self._all_answered.wait()
            except TimeoutError:
                log.warning("%d ends of transaction not answered within %d ms; the broker will check them back",
                            self._unanswered, self.send_msg_timeout_ms)
            finally:
                self._all_answered = None
        if self._check_tasks:
            _, pending = await asyncio.wait(self._check_tasks, timeout=self.shutdown_timeout_ms / 1000)
            for task in pending:
                task.cancel()
        instance = self._instance
        if instance is not None and instance.transaction_checkers.get(self.producer_group) == self._on_check:
            del instance.transaction_checkers[self.producer_group]
        await super().shutdown()

    _close = shutdown

    async def send_message_in_transaction(self, message: Message, arg: Any = None) -> TransactionSendResult:
        """Send `message` as a half message, run `execute_local_transaction(message, arg)`, then
        commit or roll back (a send answered other than SEND_OK rolls back without running the
        listener, as RocketMQ). Returns once the END_TRANSACTION is handed over, without waiting for
        its answer (RocketMQ's one-way end; past `MAX_UNANSWERED_ENDS` unanswered ends it waits).
        Raises what `send` raises for the half message; an END_TRANSACTION refused or unanswered is
        logged, not raised (the broker checks the transaction back)."""
        if self._closing:
            raise ClientStateError("transaction producer is shutting down")
        self._require_instance()
        if message.delay_level > 0:
            raise ValueError("a transactional message cannot have a delay level")
        # the half's wire properties: the message's, TAGS and KEYS (what `send` would add), TRAN_MSG, PGROUP
        properties = dict(message.properties) if message.properties else {}
        if message.tags:
            properties[PROPERTY_TAGS] = message.tags
        if message.keys:
            keys = message.keys
            properties[PROPERTY_KEYS] = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        properties[PROPERTY_PRODUCER_GROUP] = self.producer_group
        half = Message(message.topic, message.body, None, None, properties, 0, message.flag)
        self._validate(half)            # this caller's own errors, before its half joins a batch
        self._in_flight += 1
        try:
            status, msg_id, queue_id, half_offset, broker_name, transaction_id, commit_log_offset = \
                await self._halves.submit(message.topic, half)
            if status is _SEND_OK:
                state = await _decide(self.listener.execute_local_transaction, message, arg)
            else:
                state = _ROLLBACK
            queue = self._queues.get((message.topic, broker_name, queue_id))
            if queue is None:
                queue = MessageQueue(message.topic, broker_name, queue_id)
                if len(self._queues) < MAX_CACHED_QUEUES:
                    self._queues[queue] = queue
            if state is not _UNKNOW:
                entry = (message.topic, half_offset, commit_log_offset, state.commit_or_rollback, transaction_id)
                self._unanswered += 1
                if self._unanswered > MAX_UNANSWERED_ENDS:  # too many unanswered: this one waits for its answer
                    await asyncio.wait((self._ends.submit(self._address_of(queue), entry),))
                else:
                    self._ends.post(self._address_of(queue), entry)
            return _send_result(status, msg_id, queue, half_offset, transaction_id, state)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self._idle is not None:
                self._idle.set()

    def _answered(self, entry: EndEntry, outcome: BaseException | None) -> None:
        """An end's answer came in (or never will): a refusal or failure is logged, not raised."""
        self._unanswered -= 1
        if self._unanswered == 0 and self._all_answered is not None:
            self._all_answered.set()
        if outcome is None:
            return
        transaction_id, state = entry[4], _STATE_NAMES.get(entry[3], str(entry[3]))
        if isinstance(outcome, asyncio.CancelledError):
            log.warning("end of transaction %s (%s) cancelled; the broker will check it back", transaction_id, state)
        elif isinstance(outcome, MQError):
            log.warning("end of transaction %s (%s) not accepted: %s; the broker will check it back",
                        transaction_id, state, outcome)
        else:
            log.error("end of transaction %s (%s) failed; the broker will check it back", transaction_id, state,
                      exc_info=outcome)

    async def _send_halves(self, topic: str, halves: list[Message]) -> list[Sent | BaseException]:
        """The half messages of `topic` coalesced in one loop step: one SEND_BATCH_MESSAGE (`send` for
        a lone one); each one's `Sent` as `send` would answer for that half."""
        if len(halves) == 1:
            one = await self.send(halves[0])
            return [(one.status, one.msg_id, one.queue_id, one.queue_offset, one.broker_name,
                     one.uniq_keys[0] if one.uniq_keys else "", msg_id_commit_log_offset(one.msg_id))]
        try:
            batch = await self.send_batch(halves)
        except MessageIllegal:          # one message refused refuses the batch: each goes on its own
            singles = await asyncio.gather(*(self._send_halves(topic, [half]) for half in halves),
                                           return_exceptions=True)
            return [one if isinstance(one, BaseException) else one[0] for one in singles]
        ids, keys = batch.msg_ids, batch.uniq_keys
        if len(ids) != len(halves) or len(keys) != len(halves):
            raise MissingHeaderField("msg_ids", f"{len(halves)} ids", ids)
        status, queue_id, first, broker_name = batch.status, batch.queue_id, batch.queue_offset, batch.broker_name
        offsets = msg_id_commit_log_offsets(ids)
        return [(status, ids[i], queue_id, first + i, broker_name, keys[i], offsets[i]) for i in range(len(halves))]

    async def _send_ends(self, address: str, entries: list[EndEntry]) -> list[BaseException | None]:
        """The ends for one broker coalesced in one loop step: one END_TRANSACTION_BATCH
        (END_TRANSACTION for a lone one); each entry's refusal raised to its own caller."""
        api = self._require_instance().api
        if len(entries) == 1:
            topic, half_offset, commit_log_offset, action, transaction_id = entries[0]
            await api.end_transaction(address, EndTransactionRequestHeader(
                producer_group=self.producer_group, topic=topic, tran_state_table_offset=half_offset,
                commit_log_offset=commit_log_offset, commit_or_rollback=action, from_transaction_check=False,
                msg_id=transaction_id, transaction_id=transaction_id), self.send_msg_timeout_ms)
            return [None]
        codes, remarks = await api.end_transaction_batch(address, self.producer_group, entries,
                                                         self.send_msg_timeout_ms)
        return [None if code == 0 else error_for(code, remark) for code, remark in zip(codes, remarks, strict=True)]

    # -- check-backs ---------------------------------------------------------------------------------

    def _on_check(self, channel: Channel, cmd: RemotingCommand) -> None:
        try:
            header = CheckTransactionStateRequestHeader.from_fields(cmd.fields)
            message = decode_message_batch(cmd.body_bytes())[0]
        except (MQError, IndexError) as exc:
            log.warning("malformed transaction check from %s: %s", channel, exc)
            return
        key = (channel.remote_address, header.tran_state_table_offset)
        if self._closing or key in self._checking:
            return
        self._checking.add(key)
        task = asyncio.get_running_loop().create_task(self._check(channel, header, message, key))
        self._check_tasks.add(task)
        task.add_done_callback(self._check_tasks.discard)

    async def _check(self, channel: Channel, header: CheckTransactionStateRequestHeader, message: MessageExt,
                     key: tuple[str, int]) -> None:
        try:
            state = await _decide(self.listener.check_local_transaction, message)
            if state is LocalTransactionState.UNKNOW or channel.closed:
                return
            transaction_id = header.transaction_id or message.properties.get(PROPERTY_UNIQ_KEY, "")
            end = EndTransactionRequestHeader(
                producer_group=self.producer_group, topic=message.topic,
                tran_state_table_offset=header.tran_state_table_offset, commit_log_offset=header.commit_log_offset,
                commit_or_rollback=state.commit_or_rollback, from_transaction_check=True,
                msg_id=header.msg_id, transaction_id=transaction_id)
            try:
                response = await channel.invoke(request(RequestCode.END_TRANSACTION, end), self.send_msg_timeout_ms)
            except MQError as exc:
                log.info("answer to the check of transaction %s not sent: %s", transaction_id, exc)
                return
            if response.code != ResponseCode.SUCCESS:
                log.info("answer to the check of transaction %s refused: %s", transaction_id, response.remark)
        finally:
            self._checking.discard(key)
