"""Property tests of the gRPC API's pure parts: message conversion both ways, transaction ids,
the `authorization` header, status mapping."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auth.model import User
from broker.grpc.auth import GrpcAuth, parse_authorization, sign
from broker.grpc.convert import SYSTEM_PROPERTIES, message_type, send_properties, to_proto
from broker.grpc.proto import definition_pb2 as pb
from broker.grpc.sessions import parse_transaction_id, transaction_id
from broker.grpc.status import of_response
from protocol.codes import ResponseCode
from protocol.errors import MessageIllegal
from protocol.message import MessageExt

names = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=20)
texts = st.text(max_size=30)
user_properties = st.dictionaries(names.filter(lambda n: n not in SYSTEM_PROPERTIES), texts, max_size=5)


@given(tag=st.none() | names, keys=st.lists(names, max_size=4), props=user_properties, group=st.none() | names,
       delivery_s=st.none() | st.integers(0, 4_000_000_000), body=st.binary(min_size=1, max_size=64),
       transactional=st.booleans())
def test_a_sent_message_comes_back_as_it_was_sent(tag: str | None, keys: list[str], props: dict[str, str],
                                                  group: str | None, delivery_s: int | None, body: bytes,
                                                  transactional: bool) -> None:
    sent = pb.Message(body=body)
    sent.topic.name = "t"
    sent.user_properties.update(props)
    system = sent.system_properties
    system.message_id = "01ABCDEF"
    if tag is not None:
        system.tag = tag
    system.keys.extend(keys)
    if group is not None:
        system.message_group = group
    if delivery_s is not None:
        system.delivery_timestamp.seconds = delivery_s
    if transactional:
        system.message_type = pb.TRANSACTION
    properties = send_properties(sent)
    stored = MessageExt(topic="t", body=body, properties=properties, queue_id=2, queue_offset=7,
                        born_timestamp=1_700_000_000_123, store_timestamp=1_700_000_000_456, reconsume_times=3)
    back = to_proto(stored, msg_id="01ABCDEF", receipt_handle="h", invisible_ms=1_500)
    assert back.body == body and back.topic.name == "t" and dict(back.user_properties) == props
    assert back.system_properties.message_id == "01ABCDEF"
    assert (back.system_properties.tag if back.system_properties.HasField("tag") else None) == tag
    assert list(back.system_properties.keys) == [k for k in " ".join(keys).split(" ") if k]
    assert (back.system_properties.message_group if back.system_properties.HasField("message_group")
            else None) == group
    if delivery_s is not None:
        assert back.system_properties.delivery_timestamp.seconds == delivery_s
    assert back.system_properties.message_type == message_type(properties)
    assert back.system_properties.delivery_attempt == 4
    assert back.system_properties.invisible_duration.seconds == 1
    assert back.system_properties.born_timestamp.seconds == 1_700_000_000
    assert back.system_properties.body_digest.type == pb.CRC32


@pytest.mark.parametrize("name", sorted(SYSTEM_PROPERTIES))
def test_a_user_property_may_not_take_a_system_name(name: str) -> None:
    sent = pb.Message(body=b"x")
    sent.user_properties[name] = "forged"
    with pytest.raises(MessageIllegal):
        send_properties(sent)


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_transaction_ids_round_trip(commit_log_offset: int, half_offset: int) -> None:
    assert parse_transaction_id(transaction_id(commit_log_offset, half_offset)) == (commit_log_offset, half_offset)


@given(st.text(max_size=100) | st.sampled_from(["\u00b9:2", "1:\u0662", "01:002", ":", "1:2:3"]))
def test_any_text_parses_or_is_refused_without_raising(text: str) -> None:
    parsed = parse_transaction_id(text)
    if parsed is not None:
        first, second = text.split(":")
        assert parsed == (int(first), int(second))
    authorization = parse_authorization(text)
    assert authorization is None or all(authorization)


@given(st.text(string.printable, min_size=1, max_size=40), st.text(string.digits, min_size=8, max_size=8))
def test_the_clients_signature_is_accepted_and_another_key_is_not(secret: str, date: str) -> None:
    user = User(username="u", signing_key=bytes(32))
    stamp = "20260101T000000Z"
    now_ms = 1_767_225_600_000          # 2026-01-01T00:00:00Z
    good = sign(user.signing_key.hex(), stamp)
    assert GrpcAuth._refusal(user, good, stamp, now_ms) is None
    assert GrpcAuth._refusal(user, sign(secret + "x", stamp), stamp, now_ms) == "bad signature"
    assert GrpcAuth._refusal(user, good, "garbage", now_ms) == "malformed"
    assert GrpcAuth._refusal(user, good, stamp, now_ms + 3 * 86_400_000) == "expired"
    assert GrpcAuth._refusal(None, good, stamp, now_ms) == "unknown user"


@pytest.mark.parametrize("code", list(ResponseCode))
def test_every_response_code_has_a_status(code: ResponseCode) -> None:
    mapped = of_response(code, "remark")
    assert mapped.code in pb.Code.values()
    assert (mapped.code == pb.OK) == (code == ResponseCode.SUCCESS)


def test_sessions_keep_at_most_max_clients_and_close_the_oldest() -> None:
    from broker.grpc.sessions import Sessions
    sessions = Sessions(max_clients=3)
    channels = [sessions.channel(f"c{i}", "1.2.3.4")[0] for i in range(3)]
    assert sessions.channel("c1", "1.2.3.4") == (channels[1], None)         # known: the same channel
    newest, evicted = sessions.channel("c3", "1.2.3.4")
    assert evicted is channels[0] and evicted.closed and len(sessions) == 3
    assert sessions.get("c0") is None and sessions.get("c3") is newest
    channels[1].close()                                                      # expired: replaced on next use
    replaced, evicted = sessions.channel("c1", "1.2.3.4")
    assert replaced is not channels[1] and evicted is None and len(sessions) == 3
