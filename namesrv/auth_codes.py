"""`NAMESRV_CODE_MAP`: what each request code a name server handles needs (see `auth.requirements`;
RocketMQ 5.3's annotations): REGISTER_BROKER and UNREGISTER_BROKER need Update on Cluster (a
broker signs them with its `auth.inner_credentials`, so a rogue process cannot register a broker
under an existing name); GET_ROUTEINFO_BY_TOPIC needs Pub, Sub or Get on the topic (a retry topic
`%RETRY%g`: Sub or Get on Group g); GET_BROKER_CLUSTER_INFO Get on Cluster;
GET_ALL_TOPIC_LIST_FROM_NAMESERVER List on `Topic:*` (every topic); the AUTH_* codes Update
(changes) or Get (reads) on Cluster."""

from __future__ import annotations

from auth.requirements import AUTH_CODE_MAP, EVERY, GET, LIST, UPDATE, RequirementBuilder, fixed, route_query
from protocol.codes import RequestCode

NAMESRV_CODE_MAP: dict[int, RequirementBuilder] = {
    RequestCode.REGISTER_BROKER: fixed(("Cluster", "", UPDATE)),
    RequestCode.UNREGISTER_BROKER: fixed(("Cluster", "", UPDATE)),
    RequestCode.GET_ROUTEINFO_BY_TOPIC: route_query,
    RequestCode.GET_BROKER_CLUSTER_INFO: fixed(("Cluster", "", GET)),
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: fixed(("Topic", EVERY, LIST)),
    **AUTH_CODE_MAP,
}
