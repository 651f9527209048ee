"""Producer against a real broker: sends, batches, selectors, UNIQ_KEY, and failure handling."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.broker import Broker
from client import Message, MessageQueue, Producer, SelectMessageQueueByHash
from client.api import (
    ClientAPI,
    SendResult,
    SendStatus,
    _batch_result,
    _send_result,
    send_back_fields,
    send_message_fields,
)
from client.errors import ClientStateError
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import ConnectionClosed, FlushDiskTimeout, MessageIllegal, MissingHeaderField, TopicNotExist
from protocol.frame import encode_frame_bytes
from protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    SendBatchMessageResponseHeader,
    SendMessageRequestHeader,
)
from protocol.model import PullStatus
from tests.conftest import broker_config
from tests.helpers import pull_header


async def test_send_round_robins_over_queues_and_sets_uniq_key(broker: Broker, client_api: ClientAPI) -> None:
    async with Producer("pg", broker.address) as producer:
        results = [await producer.send(Message("rr", f"{i}".encode(), tags="T", keys=["k1", "k2"]))
                   for i in range(8)]
    assert sorted(r.queue_id for r in results) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert len({r.uniq_keys[0] for r in results}) == 8
    pulled = await client_api.pull_message(broker.address, pull_header(topic="rr", queue_id=results[0].queue_id),
                                           3_000)
    message = pulled.messages[0]
    assert message.uniq_key == results[0].uniq_keys[0] and message.keys == "k1 k2" and message.tags == "T"
    assert message.msg_id == results[0].msg_id


async def test_selector_by_hash_keeps_a_sharding_key_on_one_queue(broker: Broker) -> None:
    selector = SelectMessageQueueByHash()
    async with Producer("pg", broker.address) as producer:
        queue_ids = {(await producer.send(Message("ord", b"x"), selector=selector, arg="order-42")).queue_id
                     for _ in range(5)}
        other = await producer.send(Message("ord", b"x"), selector=selector, arg=7)
    assert len(queue_ids) == 1 and other.queue_id == 7 % 4


async def test_send_batch_and_explicit_queue(broker: Broker, client_api: ClientAPI) -> None:
    async with Producer("pg", broker.address) as producer:
        mq = MessageQueue("bt", broker.config.broker_name, 2)
        await producer.send(Message("bt", b"first"))                       # creates the topic
        result = await producer.send_batch([Message("bt", f"b{i}".encode()) for i in range(10)], queue=mq)
        assert result.queue_id == 2 and len(result.msg_ids) == 10 and len(set(result.uniq_keys)) == 10
        with pytest.raises(ValueError, match="same topic"):
            await producer.send_batch([Message("bt", b"a"), Message("other", b"b")])
        with pytest.raises(ValueError, match="must match"):
            await producer.send(Message("bad topic", b"x"))
    pulled = await client_api.pull_message(broker.address, pull_header(topic="bt", queue_id=2), 3_000)
    assert pulled.status is PullStatus.FOUND
    assert [m.body for m in pulled.messages][-10:] == [f"b{i}".encode() for i in range(10)]


async def test_a_batch_keys_its_messages_only_when_every_message_is_valid(broker: Broker,
                                                                          client_api: ClientAPI) -> None:
    async with Producer("pg", broker.address) as producer:
        good, delayed = Message("bk", b"a", properties={"p": "1"}), Message("bk", b"b", delay_level=2)
        with pytest.raises(ValueError, match="delay level"):
            await producer.send_batch([good, delayed])
        assert good.properties == {"p": "1"} and delayed.properties is None       # nothing keyed
        tagged = Message("bk", b"t", tags="T", keys=["k1", "k2"])
        result = await producer.send_batch([good, tagged])
        assert good.properties is not None and tagged.properties is not None
        assert (good.properties["UNIQ_KEY"], tagged.properties["UNIQ_KEY"]) == result.uniq_keys
        assert "TAGS" not in tagged.properties                     # the user's message keeps its fields
    pulled = await client_api.pull_message(broker.address, pull_header(topic="bk", queue_id=result.queue_id), 3_000)
    stored = {m.body: m for m in pulled.messages}
    assert stored[b"a"].properties["p"] == "1" and stored[b"a"].uniq_key == result.uniq_keys[0]
    assert (stored[b"t"].tags, stored[b"t"].keys) == ("T", "k1 k2") and stored[b"t"].uniq_key == result.uniq_keys[1]


async def test_errors_reach_the_caller(tmp_path: Path) -> None:
    producer = Producer("pg", "127.0.0.1:1")
    with pytest.raises(ClientStateError):
        await producer.send(Message("t", b"x"))
    async with Broker(broker_config(tmp_path)) as broker:
        async with Producer("pg", broker.address, max_message_bytes=8 * 1024 * 1024) as big:
            with pytest.raises(MessageIllegal):          # the broker's 4 MiB limit, not retried
                await big.send(Message("t", b"x" * (4 * 1024 * 1024 + 1)))
        address = broker.address
    async with Producer("pg", address, retry_times_when_send_failed=1) as orphan:
        with pytest.raises(ConnectionClosed):            # broker gone: every attempt fails
            await orphan.send(Message("t", b"x"))


async def test_a_failed_send_is_retried_on_another_broker(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path / "a", broker_name="a")) as a, \
            Broker(broker_config(tmp_path / "b", broker_name="b")) as b:
        for broker in (a, b):
            await client_api.create_topic(broker.address, "two", queue_nums=4)
        async with Producer("pg", [a.address, b.address]) as producer:
            first = await producer.send(Message("two", b"1"))          # round-robin starts on a:0
            assert (first.broker_name, first.queue_id) == ("a", 0)
            await a.stop()
            retried = await producer.send(Message("two", b"2"))        # a:1 fails, then b
            assert retried.broker_name == "b" and retried.uniq_keys and retried.msg_ids == (retried.msg_id,)


def test_send_fields_are_the_send_header_fields_key_for_key() -> None:
    properties = {"UNIQ_KEY": "K", "TAGS": "T"}
    header = SendMessageRequestHeader(producer_group="pg", topic="t", queue_id=3, flag=5, born_timestamp=42,
                                      properties=properties)
    fields = send_message_fields("pg", "t", 3, 5, 42, properties)
    assert list(fields.items()) == list(header.to_fields().items())


@given(st.integers(min_value=0, max_value=(1 << 63) - 1), st.text(max_size=20), st.integers(-1, 40),
       st.text(max_size=40), st.text(max_size=20), st.integers(-1, 1000))
def test_send_back_fields_are_the_send_back_header_fields_key_for_key(
        commit_log_offset: int, group: str, delay_level: int, origin_msg_id: str, origin_topic: str,
        max_reconsume_times: int) -> None:
    header = ConsumerSendMsgBackRequestHeader(
        commit_log_offset=commit_log_offset, group=group, delay_level=delay_level, origin_msg_id=origin_msg_id,
        origin_topic=origin_topic, max_reconsume_times=max_reconsume_times)
    fields = send_back_fields(commit_log_offset, group, delay_level, origin_msg_id, origin_topic, max_reconsume_times)
    assert list(fields.items()) == list(header.to_fields().items())
    code = RequestCode.CONSUMER_SEND_MSG_BACK
    assert encode_frame_bytes(RemotingCommand(int(code), fields=fields)) == encode_frame_bytes(request(code, header))


def test_a_batch_response_is_decoded_like_its_typed_header() -> None:
    fields = {"msg_ids": ["M1", "M2"], "queue_id": 2, "queue_offset": 9}
    typed = SendBatchMessageResponseHeader.from_fields(fields)
    assert _batch_result(fields, "t", "b", ("K1", "K2")) == SendResult(
        SendStatus.SEND_OK, "M1", typed.queue_id, typed.queue_offset, topic="t", broker_name="b",
        msg_ids=tuple(typed.msg_ids), uniq_keys=("K1", "K2"))
    assert _batch_result({**fields, "msg_ids": []}, "t", "", ()).msg_id == ""
    for bad in ({**fields, "msg_ids": ["M1", 2]}, {**fields, "queue_id": True}, {**fields, "msg_ids": "M1"},
                {"msg_ids": ["M1"], "queue_id": 2}):
        with pytest.raises(MissingHeaderField):
            _batch_result(bad, "t", "", ())


def test_a_send_response_is_decoded_like_its_typed_header() -> None:
    ok = RemotingCommand(ResponseCode.SUCCESS, flag=1, fields={"msg_id": "M", "queue_id": 2, "queue_offset": 9})
    assert _send_result(ok, "t", "b", ("K",)) == SendResult(SendStatus.SEND_OK, "M", 2, 9, topic="t",
                                                            broker_name="b", msg_ids=("M",), uniq_keys=("K",))
    late = RemotingCommand(ResponseCode.FLUSH_DISK_TIMEOUT, flag=1, fields=ok.fields)
    assert _send_result(late, "t").status is SendStatus.FLUSH_DISK_TIMEOUT
    with pytest.raises(FlushDiskTimeout, match="fsync failed"):      # no header: not stored as far as we know
        _send_result(RemotingCommand(ResponseCode.FLUSH_DISK_TIMEOUT, flag=1, remark="fsync failed"), "t")
    for bad in ({"msg_id": "M", "queue_id": True, "queue_offset": 9}, {"msg_id": "M", "queue_id": 2}):
        with pytest.raises(MissingHeaderField):
            _send_result(RemotingCommand(ResponseCode.SUCCESS, flag=1, fields=bad), "t")
    with pytest.raises(TopicNotExist):
        _send_result(RemotingCommand(ResponseCode.TOPIC_NOT_EXIST, flag=1, remark="no topic t"), "t")
