"""Allocation strategies against RocketMQ's rules (REFERENCE.md §13), by table and by property."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.consumer.allocate import (
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueByConfig,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    AllocateMessageQueueStrategy,
    strategy_by_name,
)
from protocol.model import MessageQueue

GROUP = "g"


def queues(n: int, broker_name: str = "b", topic: str = "t") -> list[MessageQueue]:
    return [MessageQueue(topic, broker_name, i) for i in range(n)]


def cids(c: int) -> list[str]:
    return [f"cid-{i}" for i in range(c)]


def allocation(strategy: AllocateMessageQueueStrategy, mq_all: Sequence[MessageQueue],
               cid_all: Sequence[str]) -> list[list[MessageQueue]]:
    """Every cid's share, in `cid_all` order."""
    return [strategy.allocate(GROUP, cid, mq_all, cid_all) for cid in cid_all]


def ids(shares: list[list[MessageQueue]]) -> list[list[int]]:
    return [[mq.queue_id for mq in share] for share in shares]


# ---------------------------------------------------------------- tables

@pytest.mark.parametrize(("n", "c", "expected"), [
    (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
    (3, 5, [[0], [1], [2], [], []]),
    (1, 1, [[0]]),
    (4, 4, [[0], [1], [2], [3]]),
    (9, 3, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
])
def test_averagely(n: int, c: int, expected: list[list[int]]) -> None:
    assert ids(allocation(AllocateMessageQueueAveragely(), queues(n), cids(c))) == expected


@pytest.mark.parametrize(("n", "c", "expected"), [
    (10, 4, [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]),
    (8, 3, [[0, 3, 6], [1, 4, 7], [2, 5]]),
    (3, 5, [[0], [1], [2], [], []]),
    (1, 1, [[0]]),
])
def test_averagely_by_circle(n: int, c: int, expected: list[list[int]]) -> None:
    assert ids(allocation(AllocateMessageQueueAveragelyByCircle(), queues(n), cids(c))) == expected


def test_strategies_take_the_given_order_without_sorting() -> None:
    mq_all = list(reversed(queues(4)))
    cid_all = ["z", "a"]
    assert ids(allocation(AllocateMessageQueueAveragely(), mq_all, cid_all)) == [[3, 2], [1, 0]]
    assert ids(allocation(AllocateMessageQueueAveragelyByCircle(), mq_all, cid_all)) == [[3, 1], [2, 0]]


CHECKED: list[AllocateMessageQueueStrategy] = [
    AllocateMessageQueueAveragely(),
    AllocateMessageQueueAveragelyByCircle(),
    AllocateMessageQueueConsistentHash(),
    AllocateMessageQueueByMachineRoom(["room1"]),
    AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), lambda mq: "r", lambda cid: "r"),
]


@pytest.mark.parametrize("strategy", CHECKED, ids=lambda s: s.name)
def test_current_cid_not_in_list_gets_nothing(strategy: AllocateMessageQueueStrategy) -> None:
    assert strategy.allocate(GROUP, "stranger", queues(4, "room1@b"), cids(2)) == []


@pytest.mark.parametrize("strategy", CHECKED, ids=lambda s: s.name)
@pytest.mark.parametrize(("current_cid", "mq_all", "cid_all"), [
    ("", queues(2), ["a"]),
    ("a", [], ["a"]),
    ("a", queues(2), []),
], ids=["empty-cid", "empty-mqs", "empty-cids"])
def test_empty_inputs_raise(strategy: AllocateMessageQueueStrategy, current_cid: str,
                            mq_all: list[MessageQueue], cid_all: list[str]) -> None:
    with pytest.raises(ValueError):
        strategy.allocate(GROUP, current_cid, mq_all, cid_all)


def test_config_returns_the_configured_queues_for_any_cid() -> None:
    configured = [MessageQueue("t", "b", 3), MessageQueue("t", "b", 1)]
    strategy = AllocateMessageQueueByConfig(configured)
    assert strategy.name == "CONFIG"
    for current_cid, mq_all, cid_all in [("a", queues(5), ["a", "b"]), ("x", queues(5), ["a"]),
                                         ("", [], [])]:
        assert strategy.allocate(GROUP, current_cid, mq_all, cid_all) == configured


def test_machine_room_example() -> None:
    mq_all = queues(5, "room1@b1") + queues(3, "room2@b2") + queues(2, "b3")
    strategy = AllocateMessageQueueByMachineRoom({"room1"})
    shares = allocation(strategy, mq_all, ["c1", "c2"])
    room1 = mq_all[:5]
    assert shares == [[room1[0], room1[1], room1[4]], [room1[2], room1[3]]]


def test_machine_room_remainder_and_several_rooms() -> None:
    mq_all = queues(4, "room1@b1") + queues(4, "room2@b2") + queues(4, "room3@b3")
    shares = allocation(AllocateMessageQueueByMachineRoom(["room1", "room2"]), mq_all, cids(3))
    pre = mq_all[:8]                    # mod 2, rem 2
    assert shares == [[pre[0], pre[1], pre[6]], [pre[2], pre[3], pre[7]], [pre[4], pre[5]]]


@pytest.mark.parametrize(("broker_name", "kept"), [
    ("room1@b", True),
    ("room1@b@", True),       # Java split drops trailing empty parts: 2 parts
    ("room1@", False),        # 1 part
    ("room1@b@c", False),     # 3 parts
    ("room1", False),
    ("room2@b", False),
    ("@room1", False),
])
def test_machine_room_broker_name_rule(broker_name: str, kept: bool) -> None:
    mq = MessageQueue("t", broker_name, 0)
    assert AllocateMessageQueueByMachineRoom(["room1"]).allocate(GROUP, "c", [mq], ["c"]) == (
        [mq] if kept else [])


ROOM_OF_CID = {"a1": "A", "a2": "A", "b1": "B"}


def nearby_queues() -> list[MessageQueue]:
    return queues(4, "A-broker") + queues(2, "B-broker") + queues(3, "C-broker") + queues(2, "D-broker")


def nearby() -> AllocateMachineRoomNearby:
    return AllocateMachineRoomNearby(AllocateMessageQueueAveragely(),
                                     lambda mq: mq.broker_name.split("-")[0], ROOM_OF_CID.get)


def test_nearby_prefers_own_room_and_shares_rooms_without_consumers() -> None:
    mq_all, cid_all = nearby_queues(), ["a1", "a2", "b1"]
    a, b, c, d = mq_all[:4], mq_all[4:6], mq_all[6:9], mq_all[9:]
    strategy = nearby()
    assert strategy.name == "MACHINE_ROOM_NEARBY-AVG"
    # own room first (AVG over the room's cids), then rooms C and D (sorted) with all cids
    assert allocation(strategy, mq_all, cid_all) == [
        [a[0], a[1], c[0], d[0]],
        [a[2], a[3], c[1], d[1]],
        [b[0], b[1], c[2]],
    ]


def test_nearby_rejects_missing_rooms() -> None:
    with pytest.raises(ValueError, match="consumer id"):
        nearby().allocate(GROUP, "a1", nearby_queues(), ["a1", "nowhere"])
    strategy = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), lambda mq: "", ROOM_OF_CID.get)
    with pytest.raises(ValueError, match="mq"):
        strategy.allocate(GROUP, "a1", nearby_queues(), ["a1"])


# ---------------------------------------------------------------- consistent hash

def java_md5_hash(key: str) -> int:
    digest = hashlib.md5(key.encode()).digest()
    return (digest[0] << 24) | (digest[1] << 16) | (digest[2] << 8) | digest[3]


def expected_consistent_hash(mq_all: list[MessageQueue], cid_all: list[str],
                             vnodes: int) -> list[list[MessageQueue]]:
    """A linear-scan ring, written independently of the module."""
    ring = {}
    for cid in cid_all:
        for k in range(vnodes):
            ring[java_md5_hash(f"{cid}-{k}")] = cid
    shares: dict[str, list[MessageQueue]] = {cid: [] for cid in cid_all}
    for mq in mq_all:
        h = java_md5_hash(f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, "
                          f"queueId={mq.queue_id}]")
        above = [node for node in ring if node >= h]
        shares[ring[min(above) if above else min(ring)]].append(mq)
    return [shares[cid] for cid in cid_all]


@pytest.mark.parametrize(("n", "c", "vnodes"), [(8, 3, 3), (5, 2, 10), (1, 1, 1), (20, 4, 3)])
def test_consistent_hash_matches_an_independent_ring(n: int, c: int, vnodes: int) -> None:
    mq_all, cid_all = queues(n, "broker-a", "TopicTest"), cids(c)
    strategy = AllocateMessageQueueConsistentHash(vnodes)
    assert strategy.name == "CONSISTENT_HASH"
    assert allocation(strategy, mq_all, cid_all) == expected_consistent_hash(mq_all, cid_all, vnodes)


def test_consistent_hash_of_a_known_key() -> None:
    # md5("a") = 0cc175b9c0f1b6a831c399e269772661
    from client.consumer.allocate import md5_hash
    assert md5_hash("a") == 0x0CC175B9


def test_consistent_hash_rejects_no_virtual_nodes() -> None:
    with pytest.raises(ValueError):
        AllocateMessageQueueConsistentHash(0)


def test_strategy_by_name() -> None:
    assert strategy_by_name("AVG").name == "AVG"
    assert strategy_by_name("AVG_BY_CIRCLE").name == "AVG_BY_CIRCLE"
    hashed = strategy_by_name("CONSISTENT_HASH", virtual_node_count=3)
    assert isinstance(hashed, AllocateMessageQueueConsistentHash) and hashed.virtual_node_count == 3
    assert strategy_by_name("CONFIG", message_queues=queues(1)).allocate(GROUP, "x", [], []) == queues(1)
    assert strategy_by_name("MACHINE_ROOM", consumer_idcs=["r"]).name == "MACHINE_ROOM"
    with pytest.raises(ValueError):
        strategy_by_name("NOPE")


# ---------------------------------------------------------------- properties

BROKER_NAMES = ["room1@b1", "room2@b2", "room3@b3", "plain", "room1@x@y"]

mq_lists = st.lists(
    st.builds(MessageQueue, st.sampled_from(["t", "u"]), st.sampled_from(BROKER_NAMES),
              st.integers(0, 15)),
    min_size=1, max_size=60, unique=True)
cid_lists = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=12, unique=True)


def assert_partition(shares: list[list[MessageQueue]], expected: Sequence[MessageQueue]) -> None:
    flat = [mq for share in shares for mq in share]
    assert len(flat) == len(set(flat)), "a queue is consumed twice"
    assert set(flat) == set(expected), "a queue is orphaned"


@given(mq_lists, cid_lists)
def test_averagely_partitions_into_contiguous_even_blocks(mq_all: list[MessageQueue],
                                                         cid_all: list[str]) -> None:
    shares = allocation(AllocateMessageQueueAveragely(), mq_all, cid_all)
    # in cid order the blocks concatenate back to mq_all: disjoint, complete and contiguous
    assert [mq for share in shares for mq in share] == mq_all
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@given(mq_lists, cid_lists)
def test_averagely_by_circle_partitions(mq_all: list[MessageQueue], cid_all: list[str]) -> None:
    shares = allocation(AllocateMessageQueueAveragelyByCircle(), mq_all, cid_all)
    assert_partition(shares, mq_all)
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


@given(mq_lists, cid_lists, st.integers(1, 12))
def test_consistent_hash_partitions(mq_all: list[MessageQueue], cid_all: list[str], vnodes: int) -> None:
    assert_partition(allocation(AllocateMessageQueueConsistentHash(vnodes), mq_all, cid_all), mq_all)


@given(mq_lists, cid_lists.filter(lambda c: len(c) >= 2), st.integers(1, 12), st.data())
def test_consistent_hash_moves_only_the_leaving_consumers_queues(
        mq_all: list[MessageQueue], cid_all: list[str], vnodes: int, data: st.DataObject) -> None:
    strategy = AllocateMessageQueueConsistentHash(vnodes)
    leaving = data.draw(st.sampled_from(cid_all))
    remaining = [cid for cid in cid_all if cid != leaving]
    before = dict(zip(cid_all, allocation(strategy, mq_all, cid_all), strict=True))
    after = dict(zip(remaining, allocation(strategy, mq_all, remaining), strict=True))
    for cid in remaining:
        assert set(before[cid]) <= set(after[cid])


@given(mq_lists, cid_lists, st.sets(st.sampled_from(["room1", "room2", "room3", "plain"])))
def test_machine_room_partitions_the_rooms_queues(mq_all: list[MessageQueue], cid_all: list[str],
                                                  idcs: set[str]) -> None:
    shares = allocation(AllocateMessageQueueByMachineRoom(idcs), mq_all, cid_all)
    in_rooms = [mq for mq in mq_all if mq.broker_name.count("@") == 1
                and mq.broker_name.split("@")[0] in idcs]
    assert_partition(shares, in_rooms)
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


@given(mq_lists, st.lists(st.tuples(st.text(min_size=1, max_size=4), st.sampled_from("123")),
                          min_size=1, max_size=10, unique_by=lambda t: t[0]))
def test_nearby_partitions(mq_all: list[MessageQueue], cid_rooms: list[tuple[str, str]]) -> None:
    room_of = dict(cid_rooms)
    strategy = AllocateMachineRoomNearby(AllocateMessageQueueAveragelyByCircle(),
                                         lambda mq: mq.broker_name[-1], room_of.get)
    assert_partition(allocation(strategy, mq_all, list(room_of)), mq_all)
