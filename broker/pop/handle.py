"""Receipt handles: what a popped message carries so the consumer can ack it or change its invisible
time (RocketMQ's POP_CK property, `ExtraInfoUtil`). Pure.

The format follows RocketMQ's space-separated layout
`ck_queue_offset pop_time invisible_time revive_qid topic_type broker_name queue_id queue_offset`;
our `ck_queue_offset` is the checkpoint id (`ck_id`) of the pop or change that handed the message
out, which is what makes a handle current or stale; `topic_type` is always "0" (a normal topic: we
revive in place, never through `%RETRY%`) and `revive_qid` always 0 (one revive queue)."""

from __future__ import annotations

from typing import NamedTuple

from protocol.errors import SystemError_


class ReceiptHandle(NamedTuple):
    """A NamedTuple, not a frozen dataclass: one is parsed per ack (the dataclass's `__init__` cost
    as much as the parse)."""

    ck_id: int
    pop_at_ms: int
    invisible_ms: int
    broker_name: str
    queue_id: int
    queue_offset: int

    def encode(self) -> str:
        return handle_prefix(self.ck_id, self.pop_at_ms, self.invisible_ms, self.broker_name,
                             self.queue_id) + str(self.queue_offset)

    @classmethod
    def parse(cls, text: str) -> ReceiptHandle:
        """Raises `SystemError_` (SYSTEM_ERROR, as any bad header field) naming the handle when it
        is not eight space-separated parts with integers where integers belong."""
        parts = text.split(" ")
        try:
            if len(parts) != 8 or not parts[5]:
                raise ValueError("not 8 parts")
            ck_id, pop_at_ms, invisible_ms, queue_id, queue_offset = (
                int(parts[0]), int(parts[1]), int(parts[2]), int(parts[6]), int(parts[7]))
        except ValueError:
            raise SystemError_(f"malformed receipt handle {text[:200]!r}") from None
        if min(ck_id, pop_at_ms, invisible_ms, queue_id, queue_offset) < 0:
            raise SystemError_(f"malformed receipt handle {text[:200]!r}: negative number")
        return cls(ck_id, pop_at_ms, invisible_ms, parts[5], queue_id, queue_offset)


def handle_prefix(ck_id: int, pop_at_ms: int, invisible_ms: int, broker_name: str, queue_id: int) -> str:
    """Everything of a handle but its queue offset (ending with a space): the handles of one pop of
    one queue share it, so a pop encodes it once and appends each offset (`prefix + str(offset)`
    is `ReceiptHandle(...).encode()`; the per-message f-string was a tenth of a pop's CPU)."""
    return f"{ck_id} {pop_at_ms} {invisible_ms} 0 0 {broker_name} {queue_id} "
