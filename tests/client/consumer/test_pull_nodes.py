"""`PullFromWhichNode` (RocketMQ `pullFromWhichNodeTable`), with no broker: a queue is pulled from
the broker last suggested while the routes have it, else from its master; a suggestion of 0
brings it back to the master."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from client.consumer.pull_nodes import PullFromWhichNode
from protocol.model import MessageQueue
from tests.client.test_route_replicas import table


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=30))
def test_each_queue_follows_its_last_suggestion(suggestions: list[tuple[int, int]]) -> None:
    addrs = {0: "m", 1: "s1", 2: "s2"}
    routes = table(addrs)
    nodes = PullFromWhichNode(lambda mq: routes.subscribe_address(mq.broker_name) or "seed",
                              routes.broker_address)
    last: dict[int, int] = {}
    for queue_id, broker_id in suggestions:
        nodes.update(MessageQueue("t", "a", queue_id), broker_id)
        last[queue_id] = broker_id
    for queue_id in range(4):
        broker_id = last.get(queue_id, 0)
        assert nodes.address(MessageQueue("t", "a", queue_id)) == addrs.get(broker_id, "s1")


def test_a_suggestion_the_routes_cannot_serve_falls_back_to_the_master() -> None:
    routes = table({0: "m"})
    nodes = PullFromWhichNode(lambda mq: routes.subscribe_address(mq.broker_name) or "seed", routes.broker_address)
    mq = MessageQueue("t", "a", 0)
    nodes.update(mq, 1)
    assert nodes.address(mq) == "m"
