"""RouteInfoManager: registration, topic replacement, unregistration and expiry (pure)."""

from __future__ import annotations

from namesrv.route_info import RouteInfoManager
from protocol.bodies import TopicConfigData


def topics(*names: str, queues: int = 4) -> list[TopicConfigData]:
    return [TopicConfigData(topic=n, read_queue_nums=queues, write_queue_nums=queues, perm=6) for n in names]


def register(routes: RouteInfoManager, name: str, addr: str, names: list[TopicConfigData], now_ms: int = 0,
             cluster: str = "c1") -> bool:
    return routes.register_broker(cluster=cluster, broker_name=name, broker_addr=addr, broker_id=0,
                                  topic_configs=names, now_ms=now_ms)


def test_a_topic_on_several_brokers_routes_to_all_of_them() -> None:
    routes = RouteInfoManager()
    assert register(routes, "b", "h:2", topics("t", "u"))
    assert register(routes, "a", "h:1", topics("t", queues=8))
    assert not register(routes, "a", "h:1", topics("t", queues=8), now_ms=5)     # a refresh, not new
    route = routes.topic_route("t")
    assert route is not None
    assert [(q.broker_name, q.read_queue_nums) for q in route.queue_datas] == [("a", 8), ("b", 4)]
    assert [(b.broker_name, b.broker_addrs) for b in route.broker_datas] == [("a", {0: "h:1"}), ("b", {0: "h:2"})]
    assert routes.all_topics() == ["t", "u"]
    assert routes.topic_route("missing") is None
    info = routes.cluster_info()
    assert info.cluster_addr_table == {"c1": ["a", "b"]} and set(info.broker_addr_table) == {"a", "b"}


def test_a_registration_replaces_the_brokers_topics() -> None:
    routes = RouteInfoManager()
    register(routes, "a", "h:1", topics("t", "u"))
    register(routes, "b", "h:2", topics("t"))
    register(routes, "a", "h:1", topics("t"))           # u deleted on a
    assert routes.all_topics() == ["t"]
    route = routes.topic_route("t")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["a", "b"]


def test_unregister_removes_the_broker_everywhere() -> None:
    routes = RouteInfoManager()
    register(routes, "a", "h:1", topics("t", "only-a"))
    register(routes, "b", "h:2", topics("t"))
    routes.unregister_broker(cluster="c1", broker_name="a", broker_addr="h:1", broker_id=0)
    route = routes.topic_route("t")
    assert route is not None and [b.broker_name for b in route.broker_datas] == ["b"]
    assert routes.topic_route("only-a") is None
    assert routes.cluster_info().cluster_addr_table == {"c1": ["b"]}
    routes.unregister_broker(cluster="c1", broker_name="b", broker_addr="h:2", broker_id=0)
    assert routes.all_topics() == [] and routes.cluster_info().cluster_addr_table == {}


def test_a_silent_broker_expires_after_the_timeout_and_not_before() -> None:
    routes = RouteInfoManager()
    register(routes, "a", "h:1", topics("t"), now_ms=0)
    register(routes, "b", "h:2", topics("t"), now_ms=0)
    register(routes, "b", "h:2", topics("t"), now_ms=100_000)      # b keeps registering, a went silent
    assert routes.scan_not_active_brokers(120_000, 120_000) == []
    assert routes.scan_not_active_brokers(120_001, 120_000) == ["h:1"]
    route = routes.topic_route("t")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["b"]
    register(routes, "a", "h:1", topics("t"), now_ms=130_000)      # it comes back
    route = routes.topic_route("t")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["a", "b"]


def test_a_slave_adds_an_address_without_touching_topics() -> None:
    routes = RouteInfoManager()
    register(routes, "a", "h:1", topics("t"))
    routes.register_broker(cluster="c1", broker_name="a", broker_addr="h:9", broker_id=1, topic_configs=[],
                           now_ms=0)
    route = routes.topic_route("t")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: "h:1", 1: "h:9"}
