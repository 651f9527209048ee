"""END_TRANSACTION_BATCH (700037) and transactional SEND_BATCH_MESSAGE on the wire: each entry
answered on its own (one bad entry does not fail the others), hostile requests (too many entries,
garbage, out-of-range or mistyped entries, a mixed batch) refused whole with nothing changed, and
a kill -9 with halves stored and ended in batches resolved after the restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest

from broker.broker import Broker
from broker.process import BrokerSubprocess
from client import LocalTransactionState, Message, MessageExt, TransactionProducer
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.broker import BrokerConfig
from conf.client import ClientConfig
from conf.store import StoreConfig
from protocol.bodies import decode_batch_ack_result
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.headers import SendBatchMessageRequestHeader
from protocol.headers_v5 import EndTransactionBatchRequestHeader
from protocol.message import BatchItem, encode_batch_items, parse_msg_id
from protocol.topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from protocol.transaction import encode_end_batch
from tests.broker.transaction.test_txn_crash import ByBody, bodies_in
from tests.conftest import broker_config
from tests.helpers import free_port

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
SYSTEM_ERROR, MESSAGE_ILLEGAL = int(ResponseCode.SYSTEM_ERROR), int(ResponseCode.MESSAGE_ILLEGAL)


class Unknown:
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return UNKNOW

    def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        return UNKNOW


async def pending_halves(broker: Broker, topic: str, count: int) -> list[tuple[str, int, int, int, str]]:
    """`count` half messages left pending (sent concurrently: one batch); their commit entries."""
    async with TransactionProducer("pg", broker.address, Unknown()) as producer:
        results = await asyncio.gather(*(producer.send_message_in_transaction(Message(topic, b"m-%d" % i))
                                         for i in range(count)))
    return [(topic, r.queue_offset, parse_msg_id(r.msg_id)[1], 8, r.transaction_id) for r in results]


def end_batch(entries: Any, group: str | None = "pg", raw: bytes | None = None) -> RemotingCommand:
    header: dict[str, Any] | EndTransactionBatchRequestHeader = (
        {} if group is None else EndTransactionBatchRequestHeader(producer_group=group))
    return request(RequestCode.END_TRANSACTION_BATCH, header, raw if raw is not None else encode_end_batch(entries))


def snapshot(broker: Broker, topic: str) -> tuple[int, ...]:
    assert broker.store is not None and broker.transactions is not None
    store = broker.store
    return (broker.transactions.table.pending_count, store.get_max_offset(TRANS_HALF_TOPIC, 0),
            store.get_max_offset(TRANS_OP_HALF_TOPIC, 0), *(store.get_max_offset(topic, q) for q in range(4)))


@pytest.fixture
async def broker(tmp_path: Path) -> Any:
    async with Broker(broker_config(tmp_path, transaction_timeout_ms=60_000)) as running:
        yield running


async def test_each_entry_is_answered_on_its_own(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "eb", queue_nums=1)
    h = await pending_halves(broker, "eb", 7)
    entries = [
        h[0],                                           # commit
        (*h[1][:3], 12, h[1][4]),                       # rollback
        ("eb", 999, h[2][2], 8, ""),                    # no half there
        ("other", *h[2][1:]),                           # another topic
        h[3],                                           # commit
        h[3],                                           # the same half again
        (*h[4][:3], 5, h[4][4]),                        # not a commit_or_rollback value
        (*h[5][:2], h[5][2] + 1, 8, h[5][4]),           # a commit-log offset that does not match
        (*h[6][:3], 0, h[6][4]),                        # unknown (0): nothing changes
    ]
    response = await client_api.remoting.invoke(broker.address, end_batch(entries), 5_000)
    assert response.code == ResponseCode.SUCCESS, response.remark
    codes, remarks = decode_batch_ack_result(response.body_bytes())
    assert codes == [0, 0, SYSTEM_ERROR, SYSTEM_ERROR, 0, SYSTEM_ERROR, SYSTEM_ERROR, SYSTEM_ERROR, 0], remarks
    assert "no half message" in remarks[2] and "is for topic 'eb'" in remarks[3]
    assert "named twice" in remarks[5] and "commit_or_rollback" in remarks[6] and "commit log offset" in remarks[7]
    assert broker.transactions is not None
    assert sorted(broker.transactions.table.pending) == [h[i][1] for i in (2, 4, 5, 6)]
    pulled = await bodies_in(client_api, broker.address, "eb")
    assert sorted(pulled) == [b"m-0", b"m-3"]
    other_group = await client_api.remoting.invoke(broker.address, end_batch([h[2]], group="not-pg"), 5_000)
    codes, remarks = decode_batch_ack_result(other_group.body_bytes())
    assert codes == [SYSTEM_ERROR] and "belongs to producer group 'pg'" in remarks[0]
    assert len(broker.transactions.table.pending) == 4


async def test_hostile_batched_ends_are_refused_whole_with_nothing_changed(broker: Broker,
                                                                           client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "hb", queue_nums=1)
    h = await pending_halves(broker, "hb", 2)
    good = h[0]
    hostile: list[tuple[RemotingCommand, int, str]] = [
        (end_batch([good] * 1025), MESSAGE_ILLEGAL, "at most 1024"),
        (end_batch(None, raw=b"\xc1\xff\x00garbage"), MESSAGE_ILLEGAL, "not msgpack"),
        (end_batch(None, raw=b""), MESSAGE_ILLEGAL, "not msgpack"),
        (end_batch([]), MESSAGE_ILLEGAL, "non-empty array"),
        (end_batch(None, raw=msgpack.packb({"entries": [good]})), MESSAGE_ILLEGAL, "non-empty array"),
        (end_batch([good, ("hb", -1, good[2], 8, "")]), MESSAGE_ILLEGAL, "entry 1: offsets"),
        (end_batch([good, ("hb", good[1], 2**64 - 1, 8, "")]), MESSAGE_ILLEGAL, "entry 1: offsets"),
        (end_batch([good, ("hb", good[1], good[2], 2**40, "")]), MESSAGE_ILLEGAL, "outside int32"),
        (end_batch([good, ("hb", str(good[1]), good[2], 8, "")]), MESSAGE_ILLEGAL, "entry 1 must be"),
        (end_batch([good, ("hb", good[1], good[2], 8)]), MESSAGE_ILLEGAL, "entry 1 must be"),
        (end_batch([good, None]), MESSAGE_ILLEGAL, "entry 1 must be"),
        (end_batch([good], group=None), SYSTEM_ERROR, "producer_group"),
    ]
    before = snapshot(broker, "hb")
    for cmd, code, remark in hostile:
        response = await client_api.remoting.invoke(broker.address, cmd, 5_000)
        assert response.code == code and remark in (response.remark or ""), (remark, response)
        assert snapshot(broker, "hb") == before, remark
    still = await client_api.remoting.invoke(broker.address, end_batch(h), 5_000)
    assert decode_batch_ack_result(still.body_bytes())[0] == [0, 0], "the halves were left as they were"


async def test_a_batch_is_transactional_whole_or_not_at_all(broker: Broker, client_api: ClientAPI) -> None:
    await client_api.create_topic(broker.address, "tb", queue_nums=1)
    half = {"TRAN_MSG": "true", "PGROUP": "pg"}
    header = SendBatchMessageRequestHeader(producer_group="pg", topic="tb", queue_id=0)
    before = snapshot(broker, "tb")
    mixed: list[tuple[list[BatchItem], str]] = [
                         ([(half, 0, b"h"), ({}, 0, b"plain")], "transactional whole or not at all"),
                          ([({}, 0, b"plain"), (half, 0, b"h")], "transactional whole or not at all"),
                          ([({"TRAN_MSG": "false"}, 0, b"h")], "TRAN_MSG must be")]
    for items, remark in mixed:
        cmd = request(RequestCode.SEND_BATCH_MESSAGE, header, encode_batch_items(items))
        response = await client_api.remoting.invoke(broker.address, cmd, 5_000)
        assert response.code == MESSAGE_ILLEGAL and remark in (response.remark or ""), response
        assert snapshot(broker, "tb") == before
    # a transactional batch: one append to the half queue, consecutive half offsets, PGROUP the sender's
    cmd = request(RequestCode.SEND_BATCH_MESSAGE, header,
                  encode_batch_items([({**half, "PGROUP": "forged"}, 0, bytes(b"h%d" % i)) for i in range(3)]))
    response = await client_api.remoting.invoke(broker.address, cmd, 5_000)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert broker.transactions is not None and broker.store is not None
    first = response.fields["queue_offset"]
    assert sorted(broker.transactions.table.pending) == [first, first + 1, first + 2]
    assert broker.store.get_max_offset("tb", 0) == 0, "nothing visible before the commit"
    entries = [("tb", first + i, parse_msg_id(msg_id)[1], 8, "") for i, msg_id in enumerate(response.fields["msg_ids"])]
    answer = await client_api.remoting.invoke(broker.address, end_batch(entries), 5_000)
    assert decode_batch_ack_result(answer.body_bytes())[0] == [0, 0, 0]
    assert sorted(await bodies_in(client_api, broker.address, "tb")) == [b"h0", b"h1", b"h2"]


class Decided(ByBody):
    """`ByBody`, its check answering what the local transaction decided (COMMIT or ROLLBACK), or
    by the body for one left UNKNOW: a listener consistent with its own local transactions."""

    def __init__(self, decided: dict[bytes, LocalTransactionState]) -> None:
        super().__init__()
        self.decided = decided

    def check_local_transaction(self, message_ext: MessageExt) -> LocalTransactionState:
        by_body = super().check_local_transaction(message_ext)
        decided = self.decided.get(message_ext.body, UNKNOW)
        return by_body if decided is UNKNOW or by_body is UNKNOW else decided


async def test_kill_9_after_batched_halves_and_ends(tmp_path: Path) -> None:
    """A commit whose answer came before the crash is delivered (at least once: its op record may
    be lost with the process, and its check-back commits it again); a rollback never is; a half
    left UNKNOW is settled by its check-back after the restart."""
    store = tmp_path / "store"
    for attempt in range(3):    # the free port may be taken by another test's process meanwhile
        port = free_port()
        proc = BrokerSubprocess(store, settings={"transaction_check_interval_ms": "600000"}, listen_port=port)
        try:
            await proc.start()
            break
        except RuntimeError:
            if attempt == 2:
                raise
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    jobs = [(f"{'c' if i % 2 == 0 else 'r'}-{i}".encode(), [COMMIT, ROLLBACK, UNKNOW][i % 3]) for i in range(60)]
    listener = Decided(dict(jobs))
    producer = TransactionProducer("kpg", proc.address, listener, client_config=ClientConfig(heartbeat_interval_ms=100))
    try:
        await api.create_topic(proc.address, "kt", queue_nums=1)
        await producer.start()
        results = await asyncio.gather(*(producer.send_message_in_transaction(Message("kt", body), state)
                                         for body, state in jobs))
        assert producer._halves.requests < 10, "the halves went in batches"
        assert [r.local_transaction_state for r in results] == [state for _, state in jobs]
        proc.kill()
        await proc.stop()
        listener.answering = True
        # checks keep coming until the producer's heartbeat reaches the new broker, however late
        checking = {"transaction_check_interval_ms": "100", "transaction_timeout_ms": "200",
                    "transaction_check_max": "1000"}
        proc = BrokerSubprocess(store, settings=checking, listen_port=port)
        await proc.start()
        committed = {body for body, state in jobs if state is COMMIT or (state is UNKNOW and body.startswith(b"c-"))}
        async with asyncio.timeout(30):        # polled (each round is a pull), as `wait_until` polls
            while set(await bodies_in(api, proc.address, "kt")) != committed:
                await asyncio.sleep(0.02)
        delivered = await bodies_in(api, proc.address, "kt")
        once = {body for body, state in jobs if state is UNKNOW and body.startswith(b"c-")}
        assert all(delivered.count(body) == 1 for body in once), "a half pending at the crash is committed once"
    finally:
        await producer.shutdown()
        await proc.stop()
        await remoting.close()
    config = BrokerConfig(listen_port=0, metrics_port=0, grpc_port=0, store=StoreConfig(path=store))
    async with Broker(config) as broker:
        assert broker.transactions is not None and broker.transactions.table.pending_count == 0
        assert broker.store is not None and broker.store.get_max_offset("kt", 0) == len(delivered)
