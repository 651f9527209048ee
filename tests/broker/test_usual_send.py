"""`usual_send`: the single send's fast-path fields, in C (`protocol._speedups.usual_send`) and in
its pure-Python twin, on the usual send, on every kind of field that must leave it to the typed
path, and on random ext maps (hypothesis), where both must give the same answer; `send_response`,
its response, the same from both and what the typed path's header says."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.processors.usual_send import send_response_py, usual_send_py
from protocol import native
from protocol.codes import ResponseCode
from protocol.frame import frame_bytes
from protocol.headers import SendMessageResponseHeader
from protocol.message import make_msg_id, msg_id_prefix

_speedups = native.speedups()
TWINS = [pytest.param(usual_send_py, id="python")]
if _speedups is not None:
    TWINS.append(pytest.param(_speedups.usual_send, id="c"))

USUAL: dict[str, Any] = {"topic": "orders", "queue_id": 3, "producer_group": "pg", "flag": -7,
                         "born_timestamp": 1_700_000_000_000, "reconsume_times": 0,
                         "properties": {"UNIQ_KEY": "K1", "TAGS": "é"}}


@pytest.mark.parametrize("twin", TWINS)
def test_the_usual_send_gives_its_fields(twin: Any) -> None:
    assert twin(USUAL, b"body", 32_767, 4 << 20) == ("orders", 3, "pg", -7, 1_700_000_000_000, 0,
                                                     USUAL["properties"])
    short = {"topic": "t", "queue_id": 0, "producer_group": "g", "properties": {}, "max_reconsume_times": None}
    assert twin(short, b"", 10, 10) == ("t", 0, "g", 0, 0, 0, {})     # absent ints are 0


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(("change", "body"), [
    ({"topic": None}, b"x"), ({"topic": b"orders"}, b"x"), ({"queue_id": True}, b"x"), ({"queue_id": 1.0}, b"x"),
    ({"producer_group": 5}, b"x"), ({"flag": 2**31}, b"x"), ({"flag": -(2**31) - 1}, b"x"), ({"flag": None}, b"x"),
    ({"born_timestamp": -1}, b"x"), ({"born_timestamp": 2**63}, b"x"), ({"born_timestamp": 2**80}, b"x"),
    ({"reconsume_times": -1}, b"x"), ({"reconsume_times": 2**31}, b"x"), ({"reconsume_times": False}, b"x"),
    ({"max_reconsume_times": 2**31}, b"x"), ({"max_reconsume_times": "16"}, b"x"),
    ({"properties": None}, b"x"), ({"properties": [["UNIQ_KEY", "K"]]}, b"x"),
    ({"properties": {"DELAY": "3"}}, b"x"), ({"properties": {"TIMER_DELIVER_MS": "1"}}, b"x"),
    ({"properties": {"TIMER_DELAY_MS": "1"}}, b"x"), ({"properties": {"TIMER_DELAY_SEC": "1"}}, b"x"),
    ({"properties": {"DEDUP": "1"}}, b"x"), ({"properties": {"k": 1}}, b"x"), ({"properties": {1: "v"}}, b"x"),
    ({"properties": {"k": "v" * 30}}, b"x"),               # 4 * 31 + 2 = 126 > 100: over the properties bound
    ({}, bytearray(b"x")), ({}, None), ({}, b"x" * 1_000),  # 1,000 + 4 * 14 + 2 * 2 > 1,000: over the message bound
])
def test_anything_else_is_left_to_the_typed_path(twin: Any, change: dict[str, Any], body: Any) -> None:
    fields = {**USUAL, **change}
    assert twin(fields, body, 100, 1_000) is None


@pytest.mark.parametrize("twin", TWINS)
def test_the_bounds_are_inclusive(twin: Any) -> None:
    fields = {**USUAL, "properties": {"ab": "cd"}}           # 4 * 4 + 2 = 18
    assert twin(fields, b"x" * 82, 18, 100) is not None
    assert twin(fields, b"x" * 83, 18, 100) is None
    assert twin(fields, b"x", 17, 100) is None
    assert twin(["not", "a", "dict"], b"x", 18, 100) is None


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                   st.text(max_size=4), st.binary(max_size=4))
PROPERTY_KEYS = st.sampled_from(["UNIQ_KEY", "TAGS", "DELAY", "DEDUP", "TIMER_DELAY_MS", "TRAN_MSG", "k"])
FIELDS = st.fixed_dictionaries({}, optional={
    "topic": st.one_of(st.just("orders"), VALUES), "queue_id": st.one_of(st.integers(0, 7), VALUES),
    "producer_group": st.one_of(st.just("pg"), VALUES), "flag": VALUES, "born_timestamp": VALUES,
    "reconsume_times": VALUES, "max_reconsume_times": VALUES,
    "properties": st.one_of(st.dictionaries(st.one_of(PROPERTY_KEYS, VALUES), st.one_of(st.text(max_size=30), VALUES),
                                            max_size=4), VALUES)})


@pytest.mark.skipif(_speedups is None, reason="protocol._speedups was not built (no C compiler?)")
@given(FIELDS, st.one_of(st.binary(max_size=200), VALUES), st.integers(0, 200), st.integers(0, 400))
def test_c_and_python_agree(fields: dict[str, Any], body: Any, max_properties_bytes: int,
                            max_message_bytes: int) -> None:
    assert _speedups is not None
    assert (_speedups.usual_send(fields, body, max_properties_bytes, max_message_bytes)
            == usual_send_py(fields, body, max_properties_bytes, max_message_bytes))


# -- the response -----------------------------------------------------------------------------------

@pytest.mark.skipif(_speedups is None, reason="protocol._speedups was not built (no C compiler?)")
@given(st.integers(-(2**31), 2**31 - 1), st.sampled_from(["7F000001002A9F", "", "é" * 3]),
       st.integers(0, 2**64 - 1), st.integers(-(2**40), 2**40), st.integers(-(2**63), 2**63 - 1))
def test_c_and_python_build_the_same_response(opaque: int, prefix: str, commit_log_offset: int, queue_id: int,
                                              queue_offset: int) -> None:
    assert _speedups is not None
    by_c = _speedups.send_response(opaque, prefix, commit_log_offset, queue_id, queue_offset)
    by_python = send_response_py(opaque, prefix, commit_log_offset, queue_id, queue_offset)
    assert by_c == by_python
    assert frame_bytes(by_c, 1 << 20) == frame_bytes(by_python, 1 << 20)      # the same ext order on the wire


@pytest.mark.skipif(_speedups is None, reason="protocol._speedups was not built (no C compiler?)")
@pytest.mark.parametrize(("prefix", "commit_log_offset"), [
    (b"7F", 1), (None, 1), ("7F", -1), ("7F", 2**64), ("7F", 1.0), ("7F", True)])
def test_c_leaves_unusual_responses_to_python(prefix: Any, commit_log_offset: Any) -> None:
    assert _speedups is not None
    assert _speedups.send_response(1, prefix, commit_log_offset, 0, 0) is None


def test_the_response_is_send_message_s_header() -> None:
    response = send_response_py(9, msg_id_prefix("127.0.0.1:10911"), 0x1234, 2, 77)
    assert response.code == ResponseCode.SUCCESS and response.opaque == 9 and response.is_response
    header = SendMessageResponseHeader.from_fields(response.fields)
    assert header == SendMessageResponseHeader(msg_id=make_msg_id("127.0.0.1:10911", 0x1234), queue_id=2,
                                               queue_offset=77)
