"""broker.trace.sets: the C `SetsBase` (`broker.trace._sets`, when built) and its twin `SetsBasePy`,
each as the base of a `TraceRecorder`, driven by the same calls (single sends, pulls, commits
forward and back, other events, drains, a full queue): the same records in the same order, the same
`dropped`, `waiting` and `recorded`, every time a float taken during the call that recorded it."""

from __future__ import annotations

from collections import deque
from time import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.trace.recorder import TraceRecorder
from broker.trace.sets import SetsBasePy
from protocol.native import load

_NATIVE = load("broker.trace._sets")


class _Channel:
    def __init__(self, remote_address: str) -> None:
        self.remote_address = remote_address


def _channel(remote_address: str | None) -> Any:
    """What a recorder reads of a channel: its `remote_address` (None: a channel without one)."""
    return _Channel(remote_address) if remote_address is not None else object()


class _PyRecorder(TraceRecorder):
    """`TraceRecorder` with the twin's per-message calls, whatever `SetsBase` is here."""

    sent_usual = SetsBasePy.sent_usual
    pulled = SetsBasePy.pulled
    committed = SetsBasePy.committed


def _masked(record: Any, started: float, ended: float) -> Any:
    """`record` as a tuple with each time it holds checked to be within [started, ended] and
    replaced by "t" (so two recorders' records compare)."""
    items = list(record)
    assert isinstance(items[1], float) and started <= items[1] <= ended, items
    items[1] = "t"
    if items[0] == "L":
        pulls = list(items[4])
        for at in range(3, len(pulls), 4):
            assert isinstance(pulls[at], float) and started <= pulls[at] <= ended, pulls
            pulls[at] = "t"
        items[4] = pulls
    return tuple(items)


calls = st.lists(st.one_of(
    st.tuples(st.just("sent_usual"), st.sampled_from(["c1", "c2"]), st.sampled_from(["g", "h"]),
              st.sampled_from(["t", "u"]), st.integers(0, 2), st.integers(0, 50)),
    st.tuples(st.just("pulled"), st.sampled_from(["c1", "c2"]), st.sampled_from(["g", "h"]),
              st.sampled_from(["t", "u"]), st.integers(0, 2), st.integers(0, 50), st.integers(0, 5),
              st.integers(0, 5)),
    st.tuples(st.just("committed"), st.sampled_from(["c1", "c2"]), st.sampled_from(["g", "h"]),
              st.sampled_from(["t", "u"]), st.integers(0, 2), st.one_of(st.none(), st.integers(0, 60)),
              st.integers(0, 60)),
    st.tuples(st.just("client"), st.sampled_from(["c1", "c2"])),
    st.tuples(st.just("drain"))), max_size=60)


@pytest.mark.skipif(_NATIVE is None, reason="broker.trace._sets was not built (or RQ_PURE_PYTHON is set)")
@settings(max_examples=400, deadline=None)
@given(calls=calls, max_events=st.integers(0, 12))
def test_the_c_calls_record_what_their_twin_records(calls: list[tuple[Any, ...]], max_events: int) -> None:
    native, twin = TraceRecorder(max_events), _PyRecorder(max_events)
    assert type(native).sent_usual is not _PyRecorder.sent_usual       # (the C one is under test)
    started = time()
    got: dict[str, list[Any]] = {"native": [], "twin": []}
    for call in [*calls, ("drain",)]:
        for name, recorder in (("native", native), ("twin", twin)):
            kind, *args = call
            if kind == "sent_usual":
                recorder.sent_usual(*args)
            elif kind == "pulled":
                client, group, topic, queue_id, from_offset, count, more = args
                recorder.pulled(_channel(client), group, topic, queue_id, from_offset, from_offset + count + more,
                                count)
            elif kind == "committed":
                recorder.committed(*args)
            elif kind == "client":
                recorder.client(args[0], "id-" + args[0])
            else:
                got[name].append([_masked(record, started, time()) for record in recorder.drain()])
            got[name].append((recorder.waiting, recorder.dropped, recorder.recorded))
    assert got["native"] == got["twin"]


@pytest.mark.skipif(_NATIVE is None, reason="broker.trace._sets was not built (or RQ_PURE_PYTHON is set)")
def test_the_c_calls_refuse_a_recorder_without_its_state() -> None:
    assert _NATIVE is not None
    bare = _NATIVE.SetsBase()
    with pytest.raises(TypeError, match="must be set"):
        bare.sent_usual("c", "g", "t", 0, 1)
    recorder = TraceRecorder(4)
    recorder._sent_sets = deque()       # type: ignore[assignment]
    with pytest.raises(TypeError, match="must be set"):
        recorder.sent_usual("c", "g", "t", 0, 1)
    with pytest.raises(AttributeError):
        TraceRecorder(4).pulled(_channel(None), "g", "t", 0, 1, 2, 1)     # (a channel has a remote_address)
