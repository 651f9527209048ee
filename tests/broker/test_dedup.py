"""`store.dedup_window_ms`: a DEDUP send is stored once per (producer group, UNIQ_KEY) within the
window, and a retry is answered with the first send's msg id, queue id and queue offset; the
index survives a restart and a kill -9, is bounded, and is off by default (issue 41)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from broker.broker import Broker
from broker.process import BrokerSubprocess
from broker.store.dedup import DedupIndex, StoredSend
from client.api import ClientAPI, SendResult
from client.remoting.remoting_client import RemotingClient
from conf.broker import BrokerConfig
from protocol.headers import SendBatchMessageRequestHeader, SendMessageRequestHeader
from protocol.message import PROPERTY_DEDUP, PROPERTY_UNIQ_KEY, Message, encode_batch_body
from tests.conftest import broker_config
from tests.helpers import send

WINDOW_MS = 600_000


def _dedup(key: str) -> dict[str, str]:
    return {PROPERTY_DEDUP: "1", PROPERTY_UNIQ_KEY: key}


def _config(tmp_path: Path, window_ms: int = WINDOW_MS, max_entries: int = 1_000_000) -> BrokerConfig:
    config = broker_config(tmp_path)
    return replace(config, store=replace(config.store, dedup_window_ms=window_ms, dedup_max_entries=max_entries))


async def _send_pg(api: ClientAPI, address: str, group: str, key: str, body: bytes = b"x") -> SendResult:
    header = SendMessageRequestHeader(producer_group=group, topic="t", queue_id=0, flag=0, born_timestamp=0,
                                      properties=_dedup(key))
    return await api.send_message(address, header, body)


async def _batch(api: ClientAPI, address: str, keys: list[str], queue_id: int = 1) -> SendResult:
    header = SendBatchMessageRequestHeader(producer_group="pg", topic="t", queue_id=queue_id)
    body = encode_batch_body([Message("t", k.encode(), properties=_dedup(k)) for k in keys])
    return await api.send_batch(address, header, body)


async def test_a_retried_dedup_send_is_stored_once_and_answered_as_the_first(tmp_path: Path,
                                                                             client_api: ClientAPI) -> None:
    async with Broker(_config(tmp_path)) as broker:
        first = await send(client_api, broker.address, properties=_dedup("k1"))
        again = await send(client_api, broker.address, properties=_dedup("k1"))
        assert (again.msg_id, again.queue_id, again.queue_offset) == (first.msg_id, first.queue_id, first.queue_offset)
        other_group = await _send_pg(client_api, broker.address, "another-group", "k1")
        plain = [await send(client_api, broker.address, properties={PROPERTY_UNIQ_KEY: "k1"}) for _ in range(2)]
        assert other_group.queue_offset == 1 and [p.queue_offset for p in plain] == [2, 3]
        assert await client_api.get_max_offset(broker.address, "t", 0) == 4


async def test_a_batch_retried_with_more_rows_stores_only_the_new_ones(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(_config(tmp_path)) as broker:
        first = await _batch(client_api, broker.address, ["a", "b"])
        again = await _batch(client_api, broker.address, ["a", "b"])
        assert (again.msg_id, again.queue_offset) == (first.msg_id, first.queue_offset)
        more = await _batch(client_api, broker.address, ["a", "b", "c"])
        assert more.msg_id.split(",")[:2] == first.msg_id.split(",") and more.queue_offset == 2
        assert await client_api.get_max_offset(broker.address, "t", 1) == 3


async def test_off_by_default_a_dedup_send_is_stored_each_time(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path)) as broker:
        for _ in range(2):
            await send(client_api, broker.address, properties=_dedup("k1"))
        await _batch(client_api, broker.address, ["a", "a"])
        assert await client_api.get_max_offset(broker.address, "t", 0) == 2
        assert await client_api.get_max_offset(broker.address, "t", 1) == 2


async def test_the_index_survives_a_restart_and_a_kill_9(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(_config(tmp_path)) as broker:
        first = await send(client_api, broker.address, properties=_dedup("k1"))
    async with Broker(_config(tmp_path)) as broker:
        again = await send(client_api, broker.address, properties=_dedup("k1"))
        # the same record (a msg id's last 16 digits: its commit-log offset; the first 16 name the host:port)
        assert (again.msg_id[16:], again.queue_offset) == (first.msg_id[16:], 0)
        assert broker.store is not None and broker.store.dedup.window_ms == WINDOW_MS
    proc = BrokerSubprocess(tmp_path / "store", settings={"store.dedup_window_ms": str(WINDOW_MS),
                                                          "store.commit_log_segment_bytes": "1048576",
                                                          "store.consume_queue_segment_units": "1000"})
    await proc.start()
    remoting = RemotingClient()
    api = ClientAPI(remoting)
    try:
        batch = await _batch(api, proc.address, ["x", "y"])
        proc.kill()
        await proc.stop()
        await proc.start()
        retried = await _batch(api, proc.address, ["x", "y"])
        assert [m[16:] for m in retried.msg_id.split(",")] == [m[16:] for m in batch.msg_id.split(",")]
        assert (await send(api, proc.address, properties=_dedup("k1"))).msg_id[16:] == first.msg_id[16:]
        assert await api.get_max_offset(proc.address, "t", 1) == 2
    finally:
        await remoting.close()
        await proc.stop()


async def test_a_flood_of_distinct_keys_keeps_the_index_bounded(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(_config(tmp_path, max_entries=50)) as broker:
        for low in range(0, 1_000, 100):
            await _batch(client_api, broker.address, [f"k{n}" for n in range(low, low + 100)])
        assert broker.store is not None and len(broker.store.dedup) == 50
        await _batch(client_api, broker.address, ["k0"])               # forgotten: stored again
        assert (await _batch(client_api, broker.address, ["k999"])).queue_offset == 999
        assert await client_api.get_max_offset(broker.address, "t", 1) == 1_001


def _stored(at_ms: int) -> StoredSend:
    return StoredSend(0, 1, 0, 0, at_ms)


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 50)), max_size=60), st.integers(1, 30),
       st.integers(1, 10))
def test_the_index_answers_a_key_within_its_window_and_stays_bounded(sends: list[tuple[int, int]], window_ms: int,
                                                                     max_entries: int) -> None:
    index, now_ms, model = DedupIndex(window_ms, max_entries), 0, dict[str, int]()
    for key, step_ms in sends:
        now_ms += step_ms
        found = index.find("g", str(key), now_ms)
        if found is not None:            # only ever a send stored within the window
            assert model[str(key)] == found.stored_at_ms and now_ms - found.stored_at_ms <= window_ms
        else:
            index.remember("g", str(key), _stored(now_ms))
            model[str(key)] = now_ms
        assert len(index) <= max_entries
    assert DedupIndex(0, 10).enabled is False


@given(st.integers(0, 2**62), st.integers(0, 2**32 - 1), st.integers(0, 2**31), st.integers(0, 2**63),
       st.integers(0, 2**44 - 1))
def test_a_stored_send_packs_into_one_int_and_back(offset: int, size: int, queue_id: int, queue_offset: int,
                                                  stored_at_ms: int) -> None:
    stored = StoredSend(offset, offset + size, queue_id, queue_offset, stored_at_ms)
    assert StoredSend.unpack(stored.packed()) == stored


@given(st.lists(st.one_of(st.none(), st.text(max_size=4)), max_size=20), st.integers(0, 10**9))
def test_a_run_remembered_is_found_as_its_messages_were_stored(keys: list[str | None], first_offset: int) -> None:
    index = DedupIndex(1_000, 1_000)
    offsets = [first_offset + 100 * i for i in range(len(keys))]
    index.remember_run("g", keys, offsets, first_offset + 100 * len(keys), 3, 7, 5_000)
    found = index.find_many("g", keys, 5_500)
    last = {key: i for i, key in enumerate(keys) if key is not None}
    for key, packed in zip(keys, found, strict=True):
        if key is None:
            assert packed is None
        else:
            j = last[key]
            assert packed is not None
            assert StoredSend.unpack(packed) == StoredSend(offsets[j], offsets[j] + 100, 3, 7 + j, 5_000)
    assert all(f is None for f in index.find_many("g", keys, 6_001))     # out of the window


@given(st.lists(st.lists(st.one_of(st.none(), st.sampled_from("abcdefgh")), max_size=8), max_size=8),
       st.integers(1, 12), st.integers(1, 400))
def test_runs_remembered_leave_the_table_as_remembering_each_in_turn(runs: list[list[str | None]], max_entries: int,
                                                                   window_ms: int) -> None:
    """`remember_run` (the batch path) against `remember` of each message in turn: the same
    entries, values and order (the order decides what is forgotten first), keys repeated within a
    run, remembered in an earlier run, evicted by the bound or by the window."""
    batched, single = DedupIndex(window_ms, max_entries), DedupIndex(window_ms, max_entries)
    offset = 1_000
    for n, keys in enumerate(runs):
        now_ms, offsets = 100 * n, [offset + 50 * i for i in range(len(keys))]
        end_offset = offset = offset + 50 * len(keys)
        batched.remember_run("g", keys, offsets, end_offset, 5, 10 * n, now_ms)
        for i, key in enumerate(keys):
            if key is not None:
                single.remember("g", key, StoredSend(offsets[i], offsets[i] + 50, 5, 10 * n + i, now_ms))
        single._evict(now_ms)           # (a run evicts what its time leaves behind even when it remembers none)
        assert list(batched._table.items()) == list(single._table.items())


async def test_odd_dedup_sends_are_stored_as_plain_ones(tmp_path: Path, client_api: ClientAPI) -> None:
    """DEDUP without a UNIQ_KEY, an empty DEDUP, and a UNIQ_KEY of ~30 kB (within the properties
    bound): nothing breaks, the first two are stored each time, the long key once."""
    async with Broker(_config(tmp_path)) as broker:
        odd = [{PROPERTY_DEDUP: "1"}, {PROPERTY_DEDUP: "", PROPERTY_UNIQ_KEY: "k"}]
        for properties in odd * 2:
            await send(client_api, broker.address, properties=properties)
        long_key = "k" * 30_000
        first = await send(client_api, broker.address, properties=_dedup(long_key))
        assert (await send(client_api, broker.address, properties=_dedup(long_key))).msg_id == first.msg_id
        assert await client_api.get_max_offset(broker.address, "t", 0) == 5
