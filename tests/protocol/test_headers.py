"""Typed headers and bodies: round trips, type checks with precise remarks, unknown keys ignored."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import headers
from protocol.bodies import (
    ConsumerData,
    ConsumerListBody,
    HeartbeatData,
    LockBatchBody,
    LockBatchResponseBody,
    SubscriptionData,
    TopicRouteData,
    decode_body,
    encode_body,
)
from protocol.errors import FieldOutOfRange, MessageIllegal, MissingHeaderField
from protocol.headers import Header
from protocol.typed import INT64, IntRange

HEADER_CLASSES: list[type[Header]] = sorted(
    {obj for obj in vars(headers).values()
     if isinstance(obj, type) and issubclass(obj, Header) and obj is not Header},
    key=lambda cls: cls.__name__,
)
BODY_CLASSES: list[type[Any]] = [HeartbeatData, LockBatchBody, TopicRouteData, ConsumerListBody,
                                 LockBatchResponseBody]


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """Values of the annotation `tp` as protocol/typed.py understands it."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    bounds = int_range(tp)
    if bounds is not None:
        return st.integers(min_value=bounds.low, max_value=bounds.high)
    if tp is str:
        return st.text(max_size=16)
    if tp is bool:
        return st.booleans()
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | strategy_for(inner)
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=3)
    if origin is list:
        return st.lists(strategy_for(args[0]), max_size=3)
    if origin is tuple:
        return st.tuples(*map(strategy_for, args))
    if dataclasses.is_dataclass(tp):
        return instances(tp)  # type: ignore[arg-type]
    raise AssertionError(f"no strategy for {tp!r}")


def int_range(tp: Any) -> IntRange | None:
    """The range an integer annotation allows (plain `int`: signed 64 bits); None if not one."""
    if tp is int:
        return INT64
    if typing.get_origin(tp) is typing.Annotated and typing.get_args(tp)[0] is int:
        return next(a for a in typing.get_args(tp)[1:] if isinstance(a, IntRange))
    return None


def instances(cls: type[Any]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return st.builds(cls, **{f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)})


def through_msgpack(value: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False)


def required_fields(cls: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def sample_value(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return None
    return {int: 0, str: "x", bool: True}.get(tp) if origin is None else origin()


# Wrong values per expected type and the type name the remark must state.
WRONG: dict[Any, tuple[str, list[Any]]] = {
    int: ("int", [True, False, 1.5, 1.0, "1", b"\x01", [1]]),
    str: ("str", [5, True, b"bytes", 1.5, ["x"]]),
    bool: ("bool", [1, 0, "true", 1.0]),
}


def _scalar_type(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


# -- headers -------------------------------------------------------------------------------------

def test_every_header_class_is_covered() -> None:
    names = {cls.__name__ for cls in HEADER_CLASSES}
    assert {"SendMessageRequestHeader", "PullMessageRequestHeader", "PullMessageResponseHeader",
            "ConsumerSendMsgBackRequestHeader", "CreateSubscriptionGroupRequestHeader"} <= names
    assert len(HEADER_CLASSES) >= 20


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_header_round_trips(cls: type[Header], data: st.DataObject) -> None:
    header = data.draw(instances(cls))
    fields = header.to_fields()
    assert set(fields) == {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    assert cls.from_fields(fields) == header
    assert cls.from_fields(through_msgpack(fields)) == header
    junk = data.draw(st.dictionaries(st.text(max_size=8), st.integers() | st.text(), max_size=3))
    with_junk = {**junk, **fields}
    assert cls.from_fields(with_junk) == header     # unknown keys are ignored


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
def test_header_defaults_and_missing_or_mistyped_fields(cls: type[Header]) -> None:
    hints = typing.get_type_hints(cls)
    required = required_fields(cls)
    minimal = {name: sample_value(hints[name]) for name in required}
    assert cls.from_fields(minimal) == cls(**minimal)           # every other field has a default
    for name in required:
        absent = {k: v for k, v in minimal.items() if k != name}
        with pytest.raises(MissingHeaderField, match=f"'{name}' is missing") as info:
            cls.from_fields(absent)
        assert info.value.field_name == name
        with pytest.raises(MissingHeaderField, match=f"'{name}' is missing; expected"):
            cls.from_fields({**minimal, name: None})            # nil counts as absent
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        scalar = _scalar_type(hints[f.name])
        if scalar not in WRONG:
            continue
        expected, wrong_values = WRONG[scalar]
        for wrong in wrong_values:
            with pytest.raises(MissingHeaderField) as info:
                cls.from_fields({**minimal, f.name: wrong})
            message = str(info.value.remark)
            assert f"field '{f.name}'" in message and message.endswith(f"expected {expected}"), message
            assert f"has type {type(wrong).__name__}" in message


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
def test_header_integers_out_of_their_range_are_refused_naming_the_range(cls: type[Header]) -> None:
    hints = typing.get_type_hints(cls, include_extras=True)
    plain = typing.get_type_hints(cls)
    minimal = {name: sample_value(plain[name]) for name in required_fields(cls)}
    error = cls.out_of_range or FieldOutOfRange
    checked = 0
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        bounds = int_range(_scalar_type(hints[f.name]))
        if bounds is None:
            continue
        for inside in (bounds.low, bounds.high):
            assert getattr(cls.from_fields({**minimal, f.name: inside}), f.name) == inside
        for outside in {bounds.low - 1, bounds.high + 1, 2**64 - 1, -1 if bounds.low == 0 else bounds.low - 1}:
            with pytest.raises(error, match=f"field '{f.name}' is {outside}, outside its range "
                                            f"{bounds.low}..{bounds.high}"):
                cls.from_fields({**minimal, f.name: outside})
        checked += 1
    assert checked == sum(int_range(_scalar_type(hints[f.name])) is not None
                          for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def test_send_headers_answer_an_integer_out_of_range_with_message_illegal() -> None:
    send = {"producer_group": "pg", "topic": "t", "queue_id": 0, "properties": {}}
    for name, value in [("reconsume_times", 2**64 - 1), ("reconsume_times", -1), ("queue_id", 1024),
                        ("flag", 2**31), ("born_timestamp", 2**63), ("max_reconsume_times", 2**64 - 1)]:
        with pytest.raises(MessageIllegal, match=name):
            headers.SendMessageRequestHeader.from_fields({**send, name: value})
    with pytest.raises(FieldOutOfRange, match="delay_level"):    # other requests: FieldOutOfRange, code 13 too
        headers.ConsumerSendMsgBackRequestHeader.from_fields({"commit_log_offset": 0, "group": "g",
                                                              "delay_level": 2**64 - 1})
    with pytest.raises(FieldOutOfRange, match="queue_offset") as info:
        headers.PullMessageRequestHeader.from_fields({
            "consumer_group": "g", "topic": "t", "queue_id": 0, "queue_offset": -1, "max_msg_nums": 1,
            "sys_flag": 0, "commit_offset": 0, "suspend_timeout_ms": 0, "sub_version": 0})
    assert info.value.code == 13    # MESSAGE_ILLEGAL: "out-of-range header integers refused with 13"


def test_container_fields_are_type_checked() -> None:
    base = {"producer_group": "g", "topic": "t", "queue_id": 1, "properties": {"TAGS": "a"}}
    with pytest.raises(MissingHeaderField, match=r"'properties' has type list .*expected map"):
        headers.SendMessageRequestHeader.from_fields({**base, "properties": [["TAGS", "a"]]})
    with pytest.raises(MissingHeaderField, match=r"properties\['TAGS'\]\" has type int .*expected str"):
        headers.SendMessageRequestHeader.from_fields({**base, "properties": {"TAGS": 1}})
    with pytest.raises(MissingHeaderField, match=r"'msg_ids\[1\]' has type int"):
        headers.SendBatchMessageResponseHeader.from_fields({"msg_ids": ["a", 2], "queue_id": 0,
                                                            "queue_offset": 0})


def test_pull_header_uses_wire_names() -> None:
    header = headers.PullMessageRequestHeader(
        consumer_group="g", topic="t", queue_id=0, queue_offset=5, max_msg_nums=32, sys_flag=0x2,
        commit_offset=0, suspend_timeout_ms=15_000, sub_version=1)
    assert header.to_fields() == {
        "consumer_group": "g", "topic": "t", "queue_id": 0, "queue_offset": 5, "max_msg_nums": 32,
        "sys_flag": 2, "commit_offset": 0, "suspend_timeout_ms": 15_000, "sub_version": 1,
        "subscription": None, "expression_type": None}


# -- bodies --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", BODY_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_body_round_trips(cls: type[Any], data: st.DataObject) -> None:
    value = data.draw(instances(cls))
    assert decode_body(cls, encode_body(value)) == value


def test_heartbeat_body_wire_shape() -> None:
    subscription = SubscriptionData(topic="t", sub_string="a || b")
    heartbeat = HeartbeatData(client_id="c1", consumer_data_set=[
        ConsumerData(group_name="g", subscription_data_set=[subscription])])
    wire = msgpack.unpackb(encode_body(heartbeat), raw=False)
    assert wire["client_id"] == "c1" and wire["producer_data_set"] == []
    (consumer,) = wire["consumer_data_set"]
    assert set(consumer) == {"group_name", "consume_type", "message_model", "consume_from_where",
                             "subscription_data_set", "unit_mode"}
    assert set(consumer["subscription_data_set"][0]) == {"topic", "sub_string", "expression_type", "tags_set",
                                                         "code_set", "sub_version"}


def test_lock_body_queues_are_arrays_and_route_broker_ids_are_ints() -> None:
    lock = LockBatchBody(consumer_group="g", client_id="c", mq_set=[("t", "broker-a", 3)])
    assert msgpack.unpackb(encode_body(lock), raw=False)["mq_set"] == [["t", "broker-a", 3]]
    route = {"queue_datas": [], "broker_datas": [{"cluster": "c", "broker_name": "b",
                                                  "broker_addrs": {0: "10.0.0.1:10911"}}]}
    decoded = decode_body(TopicRouteData, msgpack.packb(route))
    assert decoded.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911"}
    with pytest.raises(MissingHeaderField, match="broker_addrs key"):
        decode_body(TopicRouteData, msgpack.packb({**route, "broker_datas": [
            {"cluster": "c", "broker_name": "b", "broker_addrs": {"0": "x"}}]}))


@pytest.mark.parametrize("raw", [
    b"", b"\xc1", b"\x81", b"\xa3ab", msgpack.packb([1, 2]), msgpack.packb("client_id"),
    msgpack.packb({"client_id": 5}), msgpack.packb({"client_id": "c", "producer_data_set": {}}),
    msgpack.packb({"client_id": "c", "consumer_data_set": [{"group_name": "g", "unit_mode": 1}]}),
    msgpack.packb({"client_id": "c"}) + b"\x00",
])
def test_garbage_heartbeat_body_raises_missing_header_field(raw: bytes) -> None:
    with pytest.raises(MissingHeaderField, match="body"):
        decode_body(HeartbeatData, raw)


def test_nested_body_error_names_the_path() -> None:
    raw = msgpack.packb({"client_id": "c", "consumer_data_set": [
        {"group_name": "g", "subscription_data_set": [{"topic": "t", "sub_version": "1"}]}]})
    with pytest.raises(MissingHeaderField) as info:
        decode_body(HeartbeatData, raw)
    assert info.value.field_name == "body.consumer_data_set[0].subscription_data_set[0].sub_version"
    assert info.value.remark.endswith("expected int")


@pytest.mark.parametrize("cls", [HeartbeatData, LockBatchBody, TopicRouteData], ids=lambda c: c.__name__)
@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=64))
def test_random_body_bytes_decode_or_raise_missing_header_field(cls: type[Any], raw: bytes) -> None:
    try:
        value = decode_body(cls, raw)
    except MissingHeaderField:
        return
    assert isinstance(value, cls)
