"""`RouteTable`: topic → queues and broker name → address, from GET_ROUTEINFO_BY_TOPIC answers.

Each broker answers with its own queues, so the client asks every endpoint and merges the answers
(the single-broker case is the one-endpoint case of the same rule)."""

from __future__ import annotations

from collections.abc import Sequence

from protocol.bodies import BrokerData, QueueData, TopicRouteData
from protocol.codes import Perm
from protocol.model import MessageQueue

MASTER_ID = 0


def merge_routes(routes: Sequence[TopicRouteData]) -> TopicRouteData:
    """One route from several brokers' answers; a broker named twice keeps its first answer."""
    queue_datas: dict[str, QueueData] = {}
    broker_datas: dict[str, BrokerData] = {}
    for route in routes:
        for q in route.queue_datas:
            queue_datas.setdefault(q.broker_name, q)
        for b in route.broker_datas:
            broker_datas.setdefault(b.broker_name, b)
    return TopicRouteData(queue_datas=sorted(queue_datas.values(), key=lambda q: q.broker_name),
                          broker_datas=sorted(broker_datas.values(), key=lambda b: b.broker_name))


class RouteTable:
    def __init__(self) -> None:
        self._routes: dict[str, TopicRouteData] = {}
        self._brokers: dict[str, dict[int, str]] = {}
        self._publish: dict[str, list[MessageQueue]] = {}   # per topic, rebuilt when its route changes

    def update(self, topic: str, route: TopicRouteData) -> bool:
        """Store a topic's route; True when it differs from the one known."""
        changed = self._routes.get(topic) != route
        self._routes[topic] = route
        self._publish.pop(topic, None)
        for broker in route.broker_datas:
            self._brokers[broker.broker_name] = dict(broker.broker_addrs)
        return changed

    def add_brokers(self, brokers: Sequence[BrokerData]) -> None:
        """Learn broker addresses without a topic route (from GET_BROKER_CLUSTER_INFO)."""
        for broker in brokers:
            self._brokers.setdefault(broker.broker_name, dict(broker.broker_addrs))

    def topics(self) -> list[str]:
        return list(self._routes)

    def has(self, topic: str) -> bool:
        return topic in self._routes

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Queues consumers read: queue ids 0..read_queue_nums-1 of every readable broker (§15)."""
        route = self._routes.get(topic)
        if route is None:
            return []
        return [MessageQueue(topic, q.broker_name, i) for q in route.queue_datas if q.perm & Perm.READ
                for i in range(q.read_queue_nums)]

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """Queues producers write: queue ids 0..write_queue_nums-1 of every writable broker (the
        list is shared: callers must not change it)."""
        queues = self._publish.get(topic)
        if queues is None:
            route = self._routes.get(topic)
            if route is None:
                return []
            queues = self._publish[topic] = [MessageQueue(topic, q.broker_name, i) for q in route.queue_datas
                                             if q.perm & Perm.WRITE for i in range(q.write_queue_nums)]
        return queues

    def master_address(self, broker_name: str) -> str | None:
        return self._brokers.get(broker_name, {}).get(MASTER_ID)

    def broker_address(self, broker_name: str, broker_id: int) -> str | None:
        """Where a broker suggested pulling from (`suggest_which_broker_id`): `broker_id`'s address;
        for a slave id not in the routes, the slave with the lowest id (RocketMQ's
        `findBrokerAddressInSubscribe` without `onlyThisBroker`); None when there is none."""
        addrs = self._brokers.get(broker_name, {})
        address = addrs.get(broker_id)
        if address is None and broker_id != MASTER_ID:
            slaves = [b for b in addrs if b != MASTER_ID]
            address = addrs[min(slaves)] if slaves else None
        return address

    def subscribe_address(self, broker_name: str) -> str | None:
        """Where to pull a queue of `broker_name` from: its master, else (the master left the routes:
        it is down) the slave with the lowest broker id, as RocketMQ's `findBrokerAddressInSubscribe`.
        None when the broker name is unknown."""
        addrs = self._brokers.get(broker_name)
        if not addrs:
            return None
        return addrs.get(MASTER_ID) or addrs[min(addrs)]

    def broker_addresses(self) -> set[str]:
        return {addr for addrs in self._brokers.values() for addr in addrs.values()}

    def any_broker_address(self, topic: str) -> str | None:
        """The master address of the first broker serving `topic` (GET_CONSUMER_LIST_BY_GROUP)."""
        route = self._routes.get(topic)
        if route is None:
            return None
        for broker in route.broker_datas:
            address = broker.broker_addrs.get(MASTER_ID) or next(iter(broker.broker_addrs.values()), None)
            if address:
                return address
        return None
