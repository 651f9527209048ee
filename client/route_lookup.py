"""`RouteLookup`: asks the endpoints (name servers, or brokers answering for themselves) for topic
routes and cluster members, fills the client's `RouteTable`, and tells name servers from brokers
(RocketMQ `MQClientInstance#updateTopicRouteInfoFromNameServer`).

A topic that a consumer subscribes to but no broker has yet is said once at INFO, and the
endpoints' brokers are learned (GET_BROKER_CLUSTER_INFO), so the heartbeats reach them: the broker
that creates the topic then tells the group to rebalance at once (NOTIFY_CONSUMER_IDS_CHANGED), and
the rebalance finds the route. RocketMQ's consumer waits for its next route poll (30 s)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from client.api import ClientAPI
from client.heartbeat import Heartbeats
from client.route import RouteTable, merge_routes
from protocol.bodies import BrokerData, TopicRouteData
from protocol.errors import MQError, TopicNotExist
from protocol.topics import is_retry_topic

log = logging.getLogger(__name__)


class RouteLookup:
    def __init__(self, api: ClientAPI, endpoints: list[str], routes: RouteTable, name_servers: set[str],
                 heartbeats: Heartbeats, subscribers: Callable[[str], list[str]], timeout_ms: int) -> None:
        self._api, self._endpoints, self._routes = api, endpoints, routes    # endpoints: the instance's list
        self._name_servers, self._heartbeats = name_servers, heartbeats     # the instance's set, added to here
        self._subscribers, self._timeout_ms = subscribers, timeout_ms
        self.unrouted: set[str] = set()      # consumers' topics found without a route, said once

    async def update_route(self, topic: str) -> TopicRouteData | None:
        """Ask every endpoint for `topic`'s route and merge; None when no broker has the topic.
        Connection failures of some endpoints are logged; all failing raises the last error. An
        endpoint that answers after its heartbeat could not reach it is sent one at once
        (`Heartbeats.heal`), before the caller goes on to ask it for the group's members."""
        answers: list[TopicRouteData] = []
        errors: list[MQError] = []
        reached: list[str] = []
        for address in self._endpoints:
            try:
                answer = await self._api.get_route_info(address, topic, self._timeout_ms)
            except TopicNotExist:
                reached.append(address)
                continue
            except MQError as exc:
                errors.append(exc)
                continue
            reached.append(address)
            self.classify(address, {addr for broker in answer.broker_datas for addr in broker.broker_addrs.values()})
            answers.append(answer)
        await self._heartbeats.heal(reached)
        if not answers:
            if errors and len(errors) == len(self._endpoints):
                raise errors[-1]
            await self._no_route_yet(topic)
            return None
        route = merge_routes(answers)
        self._routes.update(topic, route)
        if topic in self.unrouted:
            self.unrouted.discard(topic)
            log.info("topic %s has a route now: %s", topic, ", ".join(
                f"{q.broker_name} ({q.read_queue_nums} read queues)" for q in route.queue_datas))
        return route

    def classify(self, endpoint: str, advertised: set[str]) -> None:
        """An endpoint whose answer (a route, the cluster's brokers) does not list itself among the
        `advertised` broker addresses is a name server (a broker answers for itself); one that does
        is a broker. A broker reached under another name than it advertises is classed a name
        server too, which is harmless: it is then reached at the address it advertises."""
        if endpoint in advertised:
            self._name_servers.discard(endpoint)
        else:
            self._name_servers.add(endpoint)

    async def cluster_brokers(self) -> list[BrokerData]:
        """Every broker the endpoints know (GET_BROKER_CLUSTER_INFO: a name server lists its
        cluster, a broker itself), added to the route table's addresses, each answering endpoint
        classified (`classify`); [] when none answers."""
        brokers: dict[str, BrokerData] = {}
        for address in self._endpoints:
            try:
                info = await self._api.get_broker_cluster_info(address, self._timeout_ms)
            except MQError as exc:
                log.debug("cluster info from %s failed: %s", address, exc)
                continue
            self.classify(address, {a for data in info.broker_addr_table.values() for a in data.broker_addrs.values()})
            for name, data in info.broker_addr_table.items():
                brokers.setdefault(name, data)
        result = [brokers[name] for name in sorted(brokers)]
        self._routes.add_brokers(result)
        return result

    async def _no_route_yet(self, topic: str) -> None:
        """The first time a consumer's topic (not a retry topic: the first heartbeat creates it) has
        no route: say so, and learn the endpoints' brokers so the heartbeats reach them."""
        groups = self._subscribers(topic)
        if not groups or topic in self.unrouted or is_retry_topic(topic):
            return
        self.unrouted.add(topic)
        log.info("topic %s has no route yet (no broker of %s has it); group %s will consume it as soon as it "
                 "is created", topic, ";".join(self._endpoints), ", ".join(groups))
        await self.cluster_brokers()
