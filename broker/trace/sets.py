"""`SetsBase`: the calls `TraceRecorder` gets for every message (a usual single send, a pull, a
commit) and the state they touch, as the base `TraceRecorder` derives from: the C
`broker.trace._sets.SetsBase` when it was built (~5x fewer instructions a call; issue #42), else
`SetsBasePy`, its twin, below. The records they build are described in `broker.trace.recorder`.

State (attributes of the recorder, set by its `__init__`, read and replaced by its `drain`):
`_queue` (a deque of event tuples), `_commits` ((group, topic, queue_id) -> a pending COMMITTED
record as a list of 8), `_sent_sets` and `_pulled_sets` ((topic, queue_id, group, client) -> a
flat list), `_batch_sets`, `_in_sets` (sends, pulls and batches in the sets), `_max` (the bound on
`_queue` plus `_in_sets`) and `dropped` (events not recorded: the bound was reached)."""

from __future__ import annotations

from collections import deque
from time import time
from typing import TYPE_CHECKING, Any

from protocol.channel import Channel
from protocol.native import load
from protocol.trace import COMMITTED


class SetsBasePy:
    """The twin of `broker.trace._sets.SetsBase` (see the module docstring)."""

    _queue: deque[tuple[Any, ...]]
    _commits: dict[tuple[str, str, int], list[Any]]
    _sent_sets: dict[tuple[str, int, str, str], list[Any]]
    _pulled_sets: dict[tuple[str, int, str, str], list[Any]]
    _batch_sets: dict[tuple[str, int, str, str], list[Any]]
    _in_sets: int
    _max: int
    dropped: int

    def sent_usual(self, client_addr: str, group: str, topic: str, queue_id: int, queue_offset: int) -> None:
        """SEND_MESSAGE's fast path stored one message at `queue_offset` (a SENT_SET record's offset)."""
        if len(self._queue) + self._in_sets >= self._max:
            self.dropped += 1
            return
        self._in_sets += 1
        key = (topic, queue_id, group, client_addr)
        offsets = self._sent_sets.get(key)
        if offsets is None:
            self._sent_sets[key] = [queue_offset]
        else:
            offsets.append(queue_offset)

    def pulled(self, channel: Channel, group: str, topic: str, queue_id: int, from_offset: int,
               next_offset: int, count: int) -> None:
        """A pull returned `count` messages of [from_offset, next_offset) (fewer: a filter skipped some):
        four items of a PULLED_SET record."""
        if len(self._queue) + self._in_sets >= self._max:
            self.dropped += 1
            return
        self._in_sets += 1
        key = (topic, queue_id, group, channel.remote_address)
        pulls = self._pulled_sets.get(key)
        if pulls is None:
            self._pulled_sets[key] = [from_offset, next_offset, count, time()]
        else:
            pulls += (from_offset, next_offset, count, time())

    def committed(self, client_addr: str, group: str, topic: str, queue_id: int, old_offset: int | None,
                  new_offset: int) -> None:
        """The group's committed offset of the queue moved from `old_offset` (None: none yet).
        Forward moves of one queue between two writes become one record (from the first old
        offset to the last new one, at the last move's time): a consumer commits on every pull."""
        key = (group, topic, queue_id)
        pending = self._commits.get(key)
        if pending is not None and new_offset >= pending[5] and (pending[4] is None or pending[4] <= pending[5]):
            pending[1], pending[5], pending[7] = time(), new_offset, client_addr
            return
        if pending is not None:             # a move back (a reset) stands apart from the forward runs
            if len(self._queue) < self._max:
                self._queue.append(tuple(pending))
            else:
                self.dropped += 1
        self._commits[key] = [COMMITTED, time(), topic, queue_id, old_offset, new_offset, group, client_addr]


_NATIVE = load("broker.trace._sets")
if TYPE_CHECKING:
    SetsBase = SetsBasePy
else:
    SetsBase = _NATIVE.SetsBase if _NATIVE is not None else SetsBasePy
