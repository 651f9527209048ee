"""Which address of a replica set a client reads from (RocketMQ `findBrokerAddressInSubscribe`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from client.route import RouteTable
from protocol.bodies import BrokerData, QueueData, TopicRouteData


def table(addrs: dict[int, str]) -> RouteTable:
    routes = RouteTable()
    routes.update("t", TopicRouteData(
        queue_datas=[QueueData(broker_name="a", read_queue_nums=4, write_queue_nums=4, perm=6)],
        broker_datas=[BrokerData(cluster="c", broker_name="a", broker_addrs=addrs)]))
    return routes


def test_reads_go_to_the_master_while_it_is_in_the_route() -> None:
    routes = table({0: "m:1", 1: "s:1", 2: "s:2"})
    assert routes.subscribe_address("a") == routes.master_address("a") == "m:1"


def test_reads_fall_back_to_the_lowest_slave_when_the_master_left() -> None:
    routes = table({2: "s:2", 1: "s:1"})
    assert routes.master_address("a") is None          # sends have nowhere to go
    assert routes.subscribe_address("a") == "s:1"
    assert routes.subscribe_address("unknown") is None


@given(st.dictionaries(st.integers(0, 5), st.text(min_size=1, max_size=4), min_size=1))
def test_the_read_address_is_always_one_of_the_replicas(addrs: dict[int, str]) -> None:
    chosen = table(addrs).subscribe_address("a")
    assert chosen == addrs.get(0, addrs[min(addrs)])


@given(st.dictionaries(st.integers(0, 1_001), st.text(min_size=1, max_size=4), min_size=1), st.integers(0, 1_001))
def test_a_suggested_broker_is_that_one_else_the_lowest_slave(addrs: dict[int, str], suggested: int) -> None:
    """`suggest_which_broker_id` (RocketMQ `findBrokerAddressInSubscribe` without onlyThisBroker):
    the id's address when routed; a slave id not routed falls to the lowest slave; none: None
    (the caller pulls from the master)."""
    chosen = table(addrs).broker_address("a", suggested)
    slaves = sorted(b for b in addrs if b != 0)
    if suggested in addrs:
        assert chosen == addrs[suggested]
    elif suggested != 0 and slaves:
        assert chosen == addrs[slaves[0]]
    else:
        assert chosen is None
    assert table(addrs).broker_address("unknown", suggested) is None
