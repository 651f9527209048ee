"""POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME and NOTIFICATION (RocketMQ 5's
`PopMessageProcessor`, `AckMessageProcessor`, `ChangeInvisibleTimeProcessor`,
`NotificationProcessor`) over the `PopService` state.

A pop walks the queues asked for (`queue_id` -1: every readable queue, starting one further at
each pop so consumers spread), handing out revived messages first, then new ones from the pop
offset, under the per-queue bound and the FIFO gate of `broker.pop.state`; a pop that finds nothing
is held up to `poll_time` (at most `MAX_POLL_TIME_MS`), woken by an arrival on one of its queues
(the hold service, as a held pull) or by a revive, ack or DLQ of its (group, topic), then tries
again until something is found or time is up (PULL_NOT_FOUND then, as RocketMQ answers).

Response: the body is the stored messages side by side, as a pull's; the `ext` map carries
`pop_time`, `invisible_time`, `revive_qid`, and per message in body order `extra_infos` (the receipt
handles, newline-separated) and `reconsume_times` (comma-separated; the stored value is the first
delivery's, this is the delivery's).

Pop and pull keep separate offsets: pops of a group never move its pull offsets
(`ConsumerOffsetManager`) and pulls never move its pop offsets, so a group that both pulls and
pops a topic receives each message once per way (RocketMQ keeps its pop offsets apart the same way).
SQL92 expressions are refused (SUBSCRIPTION_PARSE_FAILED): POP filters by TAG only, for now."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import msgpack

from broker.filter.filter_manager import build_tag_filter
from broker.filter.message_filter import MessageFilter
from broker.longpoll.hold_service import HeldPull, HoldService
from broker.pop.handle import ReceiptHandle, handle_prefix
from broker.pop.pop_service import PopService
from broker.processors.validate import require_group_name, require_topic_name
from broker.remoting.context import RequestContext
from broker.store.message_store import MessageStore
from broker.store.results import GetMessageStatus
from broker.topics.subscription_group_manager import SubscriptionGroupManager
from broker.topics.topic_config_manager import TopicConfigManager
from protocol.bodies import decode_batch_ack, encode_batch_ack_result
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import NoPermission, ReceiptHandleExpired, SubscriptionParseFailed, SystemError_
from protocol.headers_v5 import (
    AckMessageRequestHeader,
    BatchAckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    NotificationRequestHeader,
    NotificationResponseHeader,
    PopMessageRequestHeader,
)
from protocol.message import F_QUEUE_OFFSET

MAX_POP_NUMS = 32                       # RocketMQ: "the broker restrict msg number must be less than 32"
MAX_INVISIBLE_TIME_MS = 12 * 3600_000   # RocketMQ 5 proxy's bound on an invisible duration
MAX_POLL_TIME_MS = 120_000
MAX_BATCH_ACKS = 1_024
_FOUND = GetMessageStatus.FOUND
_Found = tuple[int, list[str], list[str], list[bytes | memoryview]] | None    # what `_pop_once` hands out
_SKIP_TO_NEXT = (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.OFFSET_TOO_SMALL,
                 GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.MESSAGE_WAS_REMOVING,
                 GetMessageStatus.OFFSET_OVERFLOW_BADLY)


def _expired_remark(group: str, topic: str, queue_id: int, offset: int) -> str:
    return (f"ack refused: the receipt handle of {topic}:{queue_id}@{offset} for group {group!r} is no longer "
            "current (its invisible time passed and the message was made visible again, or it was changed, "
            "acked or sent to the DLQ)")


class _Wake:
    """A `PullResponder` that resolves one future (the held pop's), whichever queue woke it."""

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future

    def answer(self, pulls: list[HeldPull], woken: bool) -> None:
        if not self.future.done():
            self.future.set_result(None)


def _prefix_ids(prefix: str) -> tuple[int, int]:
    """(ck_id, queue_id) of a well-formed `handle_prefix`; (-1, -1) for anything else (then the
    handle goes through `ReceiptHandle.parse`, which says what is wrong with it)."""
    parts = prefix.split(" ")
    if (len(parts) == 7 and parts[5] and parts[0].isascii() and parts[0].isdigit() and parts[6].isascii()
            and parts[6].isdigit()):
        return int(parts[0]), int(parts[6])
    return -1, -1


def _require_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise SystemError_(f"{name} = {value} is out of range [{low}, {high}]")


class PopMessageProcessor:
    def __init__(self, store: MessageStore, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 pop: PopService, hold: HoldService, broker_name: str,
                 on_popped: Callable[[int], None] | None = None) -> None:
        self._store, self._topics, self._groups = store, topics, groups
        self._on_popped = on_popped         # messages handed out (the broker's get total)
        self._pop, self._hold, self._broker_name = pop, hold, broker_name
        self._rotation = itertools.count()

    # -- POP_MESSAGE ------------------------------------------------------------------------------

    def pop_message(self, ctx: RequestContext, request: RemotingCommand) -> \
            RemotingCommand | Coroutine[Any, Any, RemotingCommand]:
        """The response now when messages are visible (or `poll_time` is 0), else a coroutine that
        holds the pop (a task only for pops that wait: it cost ~15 µs of broker CPU per pop)."""
        header = PopMessageRequestHeader.from_fields(request.fields)
        group, topic = header.consumer_group, header.topic
        require_group_name(group)
        require_topic_name(topic)
        _require_range("max_msg_nums", header.max_msg_nums, 1, MAX_POP_NUMS)
        _require_range("invisible_time", header.invisible_time, 1, MAX_INVISIBLE_TIME_MS)
        _require_range("poll_time", header.poll_time, 0, MAX_POLL_TIME_MS)
        _require_range("init_mode", header.init_mode, 0, 1)
        queues, fifo = self._queues_and_order(group, topic, header.queue_id, header.order)
        message_filter = self._filter(header.exp_type, header.exp)
        found = self._pop_once(header, queues, fifo, message_filter)
        if not found and header.poll_time > 0:
            return self._held_pop(request, header, queues, fifo, message_filter)
        return self._pop_response(request, header, found)

    async def _held_pop(self, request: RemotingCommand, header: PopMessageRequestHeader, queues: list[int],
                        fifo: bool, message_filter: MessageFilter | None) -> RemotingCommand:
        group, topic = header.consumer_group, header.topic
        deadline = time.monotonic() + header.poll_time / 1000
        found: _Found = None
        while found is None:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not await self._hold_until_change(group, topic, queues, message_filter,
                                                                      remaining_ms):
                break
            found = self._pop_once(header, queues, fifo, message_filter)
        return self._pop_response(request, header, found)

    @staticmethod
    def _pop_response(request: RemotingCommand, header: PopMessageRequestHeader, found: _Found) -> RemotingCommand:
        if found is None:
            return request.response(code=ResponseCode.PULL_NOT_FOUND, remark="no message visible")
        pop_at_ms, handles, reconsume_times, payloads = found
        fields: dict[str, Any] = {
            "pop_time": pop_at_ms, "invisible_time": header.invisible_time, "revive_qid": 0,
            "extra_infos": "\n".join(handles), "reconsume_times": ",".join(reconsume_times)}
        return request.response(header=fields, body=payloads)

    def _queues_and_order(self, group: str, topic: str, queue_id: int, order: bool) -> tuple[list[int], bool]:
        group_config = self._groups.find_or_create(group)
        if not group_config.consume_enable:
            raise NoPermission(f"consumer group {group!r} is not allowed to consume")
        fifo = order or group_config.consume_message_orderly
        if queue_id >= 0:
            self._topics.require_readable_queue(topic, queue_id)
            return [queue_id], fifo
        config = self._topics.require(topic)
        if not config.readable:
            raise NoPermission(f"topic {topic!r} is not readable (perm {config.perm})")
        count = config.read_queue_nums
        start = next(self._rotation) % max(count, 1)
        return [(start + i) % count for i in range(count)], fifo

    @staticmethod
    def _filter(exp_type: str | None, exp: str | None) -> MessageFilter | None:
        if exp_type not in (None, "", "TAG"):
            raise SubscriptionParseFailed(f"POP filters by TAG only; expression type {exp_type!r} is not supported")
        return build_tag_filter(exp)

    def _pop_once(self, header: PopMessageRequestHeader, queues: list[int], fifo: bool,
                  message_filter: MessageFilter | None) -> _Found:
        """None when nothing was handed out, else (pop_at_ms, receipt handles, reconsume times as
        decimal strings, stored payloads), one of each per message in order."""
        group, topic, store, pop = header.consumer_group, header.topic, self._store, self._pop
        pop_at_ms = pop.now_ms()
        deadline_ms = pop_at_ms + header.invisible_time
        handles: list[str] = []
        times: list[str] = []
        out: list[bytes | memoryview] = []
        for queue_id in queues:
            want = header.max_msg_nums - len(out)
            if want <= 0:
                break
            state = pop.find(group, topic, queue_id)
            if state is None:
                init = (store.get_min_offset if header.init_mode == 0 else store.get_max_offset)
                state = pop.state(group, topic, queue_id, init(topic, queue_id))
            again, new_room = state.plan(want, fifo, pop.max_in_flight)
            offsets: list[tuple[int, int]] = []
            for queue_offset, reconsume_times in again:
                result = store.get_message(topic, queue_id, queue_offset, 1, None)
                if result.status is _FOUND and result.messages:
                    offsets.append((queue_offset, reconsume_times))
                    out.append(result.messages[0])
                else:       # gone (retention): nothing to deliver again
                    state.revived.pop(queue_offset, None)
            next_offset = state.next_offset
            new_offsets: Sequence[int] = ()
            if new_room > 0:
                result = store.get_message(topic, queue_id, next_offset, new_room, message_filter)
                if result.status is _FOUND:
                    if result.message_count == result.next_begin_offset - next_offset:   # no gap: consecutive
                        new_offsets = range(next_offset, result.next_begin_offset)
                    else:
                        new_offsets = [msgpack.unpackb(p, raw=False)[F_QUEUE_OFFSET] for p in result.messages]
                    out += result.messages
                    next_offset = result.next_begin_offset
                elif result.status in _SKIP_TO_NEXT:
                    next_offset = result.next_begin_offset
            if not offsets and not new_offsets and next_offset == state.next_offset:
                continue
            if new_offsets:
                offsets += [(o, 0) for o in new_offsets]
            ck_id = pop.hand_out(group, topic, queue_id, offsets, deadline_ms, next_offset)
            prefix = handle_prefix(ck_id, pop_at_ms, header.invisible_time, self._broker_name, queue_id)
            if again:
                handles += [prefix + str(o) for o, _ in offsets]
                times += [str(r) for _, r in offsets]
            else:
                handles += map(prefix.__add__, map(str, new_offsets))      # (C loops)
                times += ["0"] * len(new_offsets)
        if not out:
            return None
        if self._on_popped is not None:
            self._on_popped(len(out))
        return pop_at_ms, handles, times, out

    async def _hold_until_change(self, group: str, topic: str, queues: list[int],
                                 message_filter: MessageFilter | None, timeout_ms: int) -> bool:
        """Wait until a message may have become visible (False: the broker is stopping)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        responder = _Wake(woken)
        pulls: list[HeldPull] = []
        for queue_id in queues:
            state = self._pop.find(group, topic, queue_id)
            queue_offset = state.next_offset if state is not None else 0
            pull = HeldPull(topic, queue_id, queue_offset, message_filter, responder)
            if not self._hold.hold(pull, timeout_ms):
                for held in pulls:
                    self._hold.cancel(held)
                return False
            pulls.append(pull)
        changed = self._pop.waiter(group, topic)
        try:
            await asyncio.wait((woken, changed), timeout=timeout_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pull in pulls:
                self._hold.cancel(pull)
            self._pop.forget(group, topic, changed)
            if not changed.done():
                changed.cancel()
        return not self._pop.stopping

    # -- ACK_MESSAGE / CHANGE_MESSAGE_INVISIBLETIME ---------------------------------------------

    def _handle(self, extra_info: str, queue_id: int, offset: int) -> ReceiptHandle:
        handle = ReceiptHandle.parse(extra_info)
        if handle.queue_id != queue_id or handle.queue_offset != offset:
            raise SystemError_(f"receipt handle {extra_info!r} is for queue {handle.queue_id} offset "
                               f"{handle.queue_offset}, not queue {queue_id} offset {offset}")
        return handle

    def ack_message(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """Acknowledge a popped message; `ReceiptHandleExpired` (NO_MESSAGE) when its handle is not
        current (revived, changed, sent to the DLQ or acked already)."""
        header = AckMessageRequestHeader.from_fields(request.fields)
        handle = self._handle(header.extra_info, header.queue_id, header.offset)
        if not self._pop.ack(header.consumer_group, header.topic, header.queue_id, header.offset, handle.ck_id):
            raise ReceiptHandleExpired(_expired_remark(header.consumer_group, header.topic, header.queue_id,
                                                       header.offset))
        return request.response()

    def batch_ack_message(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """BATCH_ACK_MESSAGE: `ack_message` for each ack of the body (at most `MAX_BATCH_ACKS`), one
        journal record for the lot; answered SUCCESS with a `BatchAckResultBody` (a code and remark
        per ack: SUCCESS, NO_MESSAGE for a stale handle, SYSTEM_ERROR for a malformed one)."""
        header = BatchAckMessageRequestHeader.from_fields(request.fields)
        acks = decode_batch_ack(request.body_bytes())
        if len(acks) > MAX_BATCH_ACKS:
            raise SystemError_(f"{len(acks)} acks in one BATCH_ACK_MESSAGE: at most {MAX_BATCH_ACKS}")
        codes = [int(ResponseCode.SUCCESS)] * len(acks)
        remarks = [""] * len(acks)
        parsed: list[tuple[int, int, int]] = []       # one per ack; ck_id -1 for a malformed handle
        prefixes: dict[str, tuple[int, int]] = {}     # the handles of one pop of one queue share a prefix
        for index, (queue_id, extra_info, offset) in enumerate(acks):
            prefix, _, tail = extra_info.rpartition(" ")   # the usual, well-formed handle: parsed once per pop
            known = prefixes.get(prefix)
            if known is None:
                known = prefixes[prefix] = _prefix_ids(prefix)
            if known[1] == queue_id >= 0 and tail == str(offset):
                parsed.append((queue_id, known[0], offset))
                continue
            try:
                parsed.append((queue_id, self._handle(extra_info, queue_id, offset).ck_id, offset))
            except SystemError_ as exc:
                codes[index], remarks[index] = int(ResponseCode.SYSTEM_ERROR), exc.remark
                parsed.append((queue_id, -1, offset))         # matches no entry: changes nothing
        current = self._pop.ack_batch(header.consumer_group, header.topic, parsed)
        if False in current:
            for index, ok in enumerate(current):
                if not ok and codes[index] == ResponseCode.SUCCESS:
                    codes[index] = int(ResponseCode.NO_MESSAGE)
                    remarks[index] = _expired_remark(header.consumer_group, header.topic, acks[index][0],
                                                     acks[index][2])
        return request.response(body=encode_batch_ack_result(codes, remarks))

    def change_invisible_time(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """Make a popped message invisible for `invisible_time` ms from now; answers the new receipt
        handle (the old one goes stale). `ReceiptHandleExpired` as `ack_message`."""
        header = ChangeInvisibleTimeRequestHeader.from_fields(request.fields)
        _require_range("invisible_time", header.invisible_time, 1, MAX_INVISIBLE_TIME_MS)
        handle = self._handle(header.extra_info, header.queue_id, header.offset)
        now_ms = self._pop.now_ms()
        new_ck_id = self._pop.change(header.consumer_group, header.topic, header.queue_id, header.offset,
                                     handle.ck_id, now_ms + header.invisible_time)
        if new_ck_id is None:
            raise ReceiptHandleExpired(
                f"change of invisible time refused: the receipt handle of {header.topic}:{header.queue_id}@"
                f"{header.offset} for group {header.consumer_group!r} is no longer current")
        new = ReceiptHandle(new_ck_id, now_ms, header.invisible_time, handle.broker_name, header.queue_id,
                            header.offset)
        return request.response(header=ChangeInvisibleTimeResponseHeader(
            extra_info=new.encode(), pop_time=now_ms, invisible_time=header.invisible_time))

    # -- NOTIFICATION -----------------------------------------------------------------------------

    async def notification(self, ctx: RequestContext, request: RemotingCommand) -> RemotingCommand:
        """`has_msg`: would a pop find something now (held up to `poll_time` while not)? Ignores tag
        filters (a hint, as RocketMQ's)."""
        header = NotificationRequestHeader.from_fields(request.fields)
        require_group_name(header.consumer_group)
        require_topic_name(header.topic)
        _require_range("poll_time", header.poll_time, 0, MAX_POLL_TIME_MS)
        queues, fifo = self._queues_and_order(header.consumer_group, header.topic, header.queue_id, header.order)
        has_msg = self._visible(header.consumer_group, header.topic, queues, fifo)
        deadline = time.monotonic() + header.poll_time / 1000
        while not has_msg:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not await self._hold_until_change(header.consumer_group, header.topic, queues,
                                                                      None, remaining_ms):
                break
            has_msg = self._visible(header.consumer_group, header.topic, queues, fifo)
        return request.response(header=NotificationResponseHeader(has_msg=has_msg))

    def _visible(self, group: str, topic: str, queues: list[int], fifo: bool) -> bool:
        for queue_id in queues:
            state = self._pop.find(group, topic, queue_id)
            if state is None:
                if self._store.get_max_offset(topic, queue_id) > self._store.get_min_offset(topic, queue_id):
                    return True
                continue
            again, new_room = state.plan(1, fifo, self._pop.max_in_flight)
            if again or (new_room and self._store.get_max_offset(topic, queue_id) > state.next_offset):
                return True
        return False
