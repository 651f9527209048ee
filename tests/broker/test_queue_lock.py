"""Queue locks for orderly consumption: the pure `LockManager` on a manual clock (table-driven and a
property test against a model), and LOCK_BATCH_MQ / UNLOCK_BATCH_MQ over TCP on a real broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.broker import Broker
from broker.locks.lock_manager import LockManager
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from protocol.clock import ManualClock
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.errors import SystemError_
from protocol.model import MessageQueue
from tests.conftest import broker_config

Q = [MessageQueue("t", "broker-a", i) for i in range(4)]


def test_a_live_lock_is_exclusive_refreshed_by_relocking_and_expires() -> None:
    clock = ManualClock()
    locks = LockManager(clock, lock_max_live_ms=60_000)
    assert locks.try_lock_batch("g", Q[:2], "A") == set(Q[:2])
    assert locks.try_lock_batch("g", Q, "B") == set(Q[2:])          # A's two stay A's
    assert locks.try_lock_batch("other-group", Q[:1], "B") == {Q[0]}  # groups are separate tables
    clock.advance(50_000)
    assert locks.try_lock_batch("g", Q[:1], "A") == {Q[0]}           # refresh of Q0 only
    clock.advance(10_001)                                            # Q1 is 60.001 s old, Q0 10.001 s
    assert locks.is_locked("g", Q[0], "A") and not locks.is_locked("g", Q[1], "A")
    assert locks.try_lock_batch("g", Q[:2], "B") == {Q[1]}           # B takes the expired one over
    assert locks.owners("g") == {Q[0]: "A", Q[1]: "B"}               # B's Q2, Q3 (60.001 s) expired
    clock.advance(60_000)                                            # Q1 exactly at the limit: live
    assert locks.owners("g") == {Q[1]: "B"}
    clock.advance(1)
    assert locks.owners("g") == {}


def test_unlock_releases_only_the_callers_own_locks() -> None:
    locks = LockManager(ManualClock(), lock_max_live_ms=60_000)
    locks.try_lock_batch("g", Q[:2], "A")
    locks.try_lock_batch("g", Q[2:], "B")
    assert locks.unlock_batch("g", Q, "A") == set(Q[:2])
    assert locks.owners("g") == {Q[2]: "B", Q[3]: "B"}
    assert locks.unlock_batch("nobody-locked-here", Q, "A") == set()
    assert locks.try_lock_batch("g", Q, "C") == set(Q[:2])


def test_lock_max_live_ms_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lock_max_live_ms"):
        LockManager(ManualClock(), lock_max_live_ms=0)


OPS = st.lists(st.tuples(st.sampled_from(["lock", "unlock", "advance"]), st.sampled_from("ABC"),
                         st.sets(st.integers(0, 3)), st.integers(0, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_lock_manager_matches_a_model(ops: list[tuple[str, str, set[int], int]]) -> None:
    """Against a dictionary model: after every step, each queue has at most one live owner, and the
    grants are exactly the free, own or expired queues."""
    clock = ManualClock(monotonic_ms=0)
    locks = LockManager(clock, lock_max_live_ms=30)
    model: dict[int, tuple[str, int]] = {}      # queue id -> (owner, last refresh)
    for op, client, ids, ms in ops:
        now = clock.monotonic_ms()
        if op == "advance":
            clock.advance(ms)
            continue
        queues = [Q[i] for i in ids]
        if op == "lock":
            expected = {Q[i] for i in ids if i not in model or model[i][0] == client or now - model[i][1] > 30}
            assert locks.try_lock_batch("g", queues, client) == expected
            model.update({mq.queue_id: (client, now) for mq in expected})
        else:
            expected = {Q[i] for i in ids if i in model and model[i][0] == client}
            assert locks.unlock_batch("g", queues, client) == expected
            for mq in expected:
                del model[mq.queue_id]
        model = {i: (owner, at) for i, (owner, at) in model.items() if clock.monotonic_ms() - at <= 30}
        assert locks.owners("g") == {Q[i]: owner for i, (owner, _) in model.items()}   # forgets expired


async def test_lock_and_unlock_over_the_wire(tmp_path: Path) -> None:
    clock = ManualClock()
    async with Broker(broker_config(tmp_path, lock_max_live_ms=60_000), clock=clock) as broker:
        remotings = [RemotingClient(), RemotingClient()]
        a, b = (ClientAPI(r) for r in remotings)
        try:
            assert await a.lock_batch_mq(broker.address, "g", "A", Q[:2]) == set(Q[:2])
            assert await b.lock_batch_mq(broker.address, "g", "B", Q) == set(Q[2:])
            await remotings[0].close()          # A's connection goes: its locks stay (expiry frees them)
            assert await b.lock_batch_mq(broker.address, "g", "B", Q[:2]) == set()
            assert broker.locks.owners("g") == {Q[0]: "A", Q[1]: "A", Q[2]: "B", Q[3]: "B"}
            clock.advance(60_001)
            assert await b.lock_batch_mq(broker.address, "g", "B", Q[:1]) == {Q[0]}
            await b.unlock_batch_mq(broker.address, "g", "A", Q)          # not A's any more: no effect
            assert broker.locks.owners("g") == {Q[0]: "B"}                 # Q2, Q3 expired, Q1 too
            await b.unlock_batch_mq(broker.address, "g", "B", Q)
            assert broker.locks.owners("g") == {}
        finally:
            for remoting in remotings:
                await remoting.close()


async def test_bad_lock_requests_get_a_clear_error(broker: Broker, client_api: ClientAPI) -> None:
    with pytest.raises(SystemError_, match="client_id"):
        await client_api.lock_batch_mq(broker.address, "g", "", Q)
    with pytest.raises(SystemError_, match="group"):
        await client_api.lock_batch_mq(broker.address, "bad group!", "A", Q)
    with pytest.raises(SystemError_, match="topic"):
        await client_api.lock_batch_mq(broker.address, "g", "A", [MessageQueue("no/slash", "b", 0)])
    response = await client_api.remoting.invoke(broker.address, request(RequestCode.LOCK_BATCH_MQ,
                                                                         body=b"\xc1garbage"), 3_000)
    assert response.code == ResponseCode.SYSTEM_ERROR and "body" in (response.remark or "")
    assert broker.locks.owners("g") == {}
