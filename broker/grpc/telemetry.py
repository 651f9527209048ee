"""Telemetry, the bidirectional stream of `MessagingService` (Java proxy: `ClientActivity.telemetry`).

A client sends its `Settings` first and again whenever they change; each is answered with the
broker's view of them: a producer's publishing settings (no message type validation, the store's
largest body) with an exponential send backoff, a consumer's subscription with the group's FIFO
flag and a customised backoff: the broker's retry delays (delay levels 3 and on, as a POP revive
waits) for the group's `retry_max_times + 1` attempts. The broker's commands go out on the same
stream (transaction check-backs: `sessions.ClientChannel`). A client's thread stack trace and
verify-message results are accepted and logged (the broker never asks for them). A stream ends
when the client ends it, the client is expired or terminated, or the broker stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from google.protobuf.duration_pb2 import Duration

from broker.grpc.calls import Caller
from broker.grpc.produce import Context, ProduceCalls
from broker.grpc.proto import definition_pb2 as pb
from broker.grpc.proto import service_pb2 as spb
from broker.grpc.sessions import MAX_QUEUED_COMMANDS
from broker.grpc.status import ok, status
from broker.pop.processor import MAX_POLL_TIME_MS
from broker.retry_policy import FIRST_RETRY_DELAY_LEVEL
from protocol.topics import check_topic

log = logging.getLogger(__name__)
SEND_ATTEMPTS = 3
MAX_REQUEST_TIMEOUT_MS = 3_600_000
MAX_SETTINGS_TOPICS = 1_000
DEFAULT_LONG_POLLING_MS = 20_000        # a consumer's receives are held this long unless it asks otherwise
DEFAULT_RETRY_MAX_TIMES = 16


def _ms(duration: Duration) -> int:
    return max(int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000, 0)


def _duration(ms: int) -> Duration:
    seconds, millis = divmod(max(ms, 0), 1000)
    return Duration(seconds=seconds, nanos=millis * 1_000_000)


class TelemetryCalls(ProduceCalls):
    delay_levels_ms: tuple[int, ...] = (1_000, 5_000, 10_000, 30_000, 60_000)

    def settings_answer(self, settings: pb.Settings) -> pb.Settings:
        """The broker's answer to a client's `settings` (see the module docstring): built afresh,
        never an echo of the client's lists, so its size is the broker's choice (< 1 KiB)."""
        answer = pb.Settings(client_type=settings.client_type)
        if settings.HasField("request_timeout"):
            answer.request_timeout.CopyFrom(_duration(min(_ms(settings.request_timeout), MAX_REQUEST_TIMEOUT_MS)))
        if settings.WhichOneof("pub_sub") == "publishing":
            answer.publishing.validate_message_type = False
            answer.publishing.max_body_size = self.parts.config.store.max_message_bytes
            answer.backoff_policy.max_attempts = SEND_ATTEMPTS
            backoff = answer.backoff_policy.exponential_backoff
            backoff.initial.CopyFrom(_duration(10))
            backoff.max.CopyFrom(_duration(1_000))
            backoff.multiplier = 2.0
        elif settings.WhichOneof("pub_sub") == "subscription":
            group = self.parts.groups.get(settings.subscription.group.name) if settings.subscription.group.name \
                else None
            retry_max_times = group.retry_max_times if group is not None else DEFAULT_RETRY_MAX_TIMES
            if group is not None:
                answer.subscription.group.name = group.group_name
            answer.subscription.fifo = bool(group is not None and group.consume_message_orderly)
            answer.subscription.receive_batch_size = min(max(settings.subscription.receive_batch_size, 1), 32)
            asked_ms = _ms(settings.subscription.long_polling_timeout)      # a push consumer asks none
            answer.subscription.long_polling_timeout.CopyFrom(_duration(
                min(asked_ms, MAX_POLL_TIME_MS) if asked_ms else DEFAULT_LONG_POLLING_MS))
            answer.backoff_policy.max_attempts = retry_max_times + 1
            levels = self.delay_levels_ms[FIRST_RETRY_DELAY_LEVEL - 1:] or (1_000,)
            answer.backoff_policy.customized_backoff.next.extend(
                _duration(max(1_000, -(-ms // 1000) * 1000)) for ms in levels[:max(retry_max_times, 1)])
        return answer

    async def Telemetry(self, request_iterator: AsyncIterator[spb.TelemetryCommand],
                        context: Context) -> AsyncIterator[spb.TelemetryCommand]:
        try:
            caller = self.caller(context)
        except Exception as exc:
            yield spb.TelemetryCommand(status=status(pb.UNAUTHORIZED, str(exc)))
            return
        if caller.channel is None:
            yield spb.TelemetryCommand(status=status(pb.CLIENT_ID_REQUIRED, "x-mq-client-id metadata is required"))
            return
        channel = caller.channel
        queue: asyncio.Queue[spb.TelemetryCommand | None] = asyncio.Queue()
        if channel.stream is not None:          # a newer stream replaces the older one
            channel.stream.put_nowait(None)
        channel.stream = queue
        reader = asyncio.get_running_loop().create_task(self._read(caller, request_iterator, queue))
        try:
            while True:
                command = await queue.get()
                if command is None:
                    return
                yield command
        finally:
            channel.end_stream(queue)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read(self, caller: Caller, commands: AsyncIterator[spb.TelemetryCommand],
                    queue: asyncio.Queue[spb.TelemetryCommand | None]) -> None:
        channel = caller.channel
        assert channel is not None
        try:
            async for command in commands:
                if queue.qsize() >= MAX_QUEUED_COMMANDS:     # answers unread: a client that only writes
                    log.info("%r: telemetry answers unread past %d; stream ended", channel, MAX_QUEUED_COMMANDS)
                    break
                kind = command.WhichOneof("command")
                if kind == "settings":
                    settings = command.settings
                    topics = tuple(t.name for t in settings.publishing.topics[:MAX_SETTINGS_TOPICS]
                                   if check_topic(t.name) is None)
                    if (settings.client_type, topics) != (channel.client_type, channel.topics):
                        channel.client_type, channel.topics = settings.client_type, topics
                        self.register_producer(caller)      # else its heartbeats keep it registered
                    queue.put_nowait(spb.TelemetryCommand(status=ok(), settings=self.settings_answer(command.settings)))
                elif kind == "thread_stack_trace":
                    log.info("%r: thread stack trace (nonce %s): %.2000s", channel, command.thread_stack_trace.nonce,
                             command.thread_stack_trace.thread_stack_trace)
                elif kind == "verify_message_result":
                    log.info("%r: verify message result (nonce %s)", channel, command.verify_message_result.nonce)
                else:
                    queue.put_nowait(spb.TelemetryCommand(status=status(pb.BAD_REQUEST,
                                                                        f"telemetry command {kind} is not expected")))
        except asyncio.CancelledError:
            raise
        except Exception as exc:        # the client went away mid-stream
            log.debug("%r: telemetry stream ended: %s", channel, exc)
        queue.put_nowait(None)
