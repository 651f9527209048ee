"""`RouteInfoManager`: the name server's tables (RocketMQ `RouteInfoManager`, REFERENCE.md §15).

Pure: no I/O and no clock reads (times are passed in), so expiry is tested with plain numbers.
- topic -> broker name -> `QueueData` (queue counts and perm of the topic on that broker);
- broker name -> `BrokerData` (cluster, broker id -> "host:port"; id 0 is the master);
- cluster -> broker names; broker address -> last registration (live table)."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.bodies import BrokerData, ClusterInfo, QueueData, TopicConfigData, TopicRouteData


@dataclass(slots=True)
class BrokerLive:
    cluster: str
    broker_name: str
    broker_id: int
    last_update_ms: int
    ha_server_addr: str = ""


class RouteInfoManager:
    def __init__(self) -> None:
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLive] = {}

    def register_broker(self, *, cluster: str, broker_name: str, broker_addr: str, broker_id: int,
                        topic_configs: list[TopicConfigData], now_ms: int, ha_server_addr: str = "",
                        grpc_addr: str = "") -> bool:
        """Record a broker's registration; True when the broker address is new. A master's
        (`broker_id` 0) topic list replaces what was known of that broker: a topic it no longer
        lists leaves the broker's routes. Slaves only refresh their liveness and address.
        `grpc_addr`: where the broker serves the gRPC API ("": nowhere)."""
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)
        data = self.broker_addr_table.get(broker_name)
        addrs = dict(data.broker_addrs) if data is not None else {}
        for other_id, addr in list(addrs.items()):     # an address that changed role (RocketMQ)
            if addr == broker_addr and other_id != broker_id:
                del addrs[other_id]
        addrs[broker_id] = broker_addr
        grpc_addrs = {i: a for i, a in (data.grpc_addrs if data is not None else {}).items() if i in addrs}
        if grpc_addr:
            grpc_addrs[broker_id] = grpc_addr
        else:
            grpc_addrs.pop(broker_id, None)
        self.broker_addr_table[broker_name] = BrokerData(cluster=cluster, broker_name=broker_name,
                                                         broker_addrs=addrs, grpc_addrs=grpc_addrs)
        if broker_id == 0:
            listed = {config.topic for config in topic_configs}
            for topic in [t for t, brokers in self.topic_queue_table.items() if broker_name in brokers]:
                if topic not in listed:
                    self._remove_topic_broker(topic, broker_name)
            for config in topic_configs:
                self.topic_queue_table.setdefault(config.topic, {})[broker_name] = QueueData(
                    broker_name=broker_name, read_queue_nums=config.read_queue_nums,
                    write_queue_nums=config.write_queue_nums, perm=config.perm)
        new = broker_addr not in self.broker_live_table
        self.broker_live_table[broker_addr] = BrokerLive(cluster, broker_name, broker_id, now_ms, ha_server_addr)
        return new

    def master_of(self, broker_name: str) -> tuple[str, str]:
        """(master address, its HA address) of a replica set; ("", "") while it has no live master."""
        data = self.broker_addr_table.get(broker_name)
        master = data.broker_addrs.get(0, "") if data is not None else ""
        live = self.broker_live_table.get(master) if master else None
        return (master, live.ha_server_addr) if live is not None else ("", "")

    def unregister_broker(self, *, cluster: str, broker_name: str, broker_addr: str, broker_id: int) -> None:
        """Forget one broker address; when its broker name has no address left, the broker leaves
        its cluster and every topic route (a topic left with no broker disappears)."""
        self.broker_live_table.pop(broker_addr, None)
        data = self.broker_addr_table.get(broker_name)
        if data is None:
            return
        addrs = {i: a for i, a in data.broker_addrs.items() if not (i == broker_id and a == broker_addr)}
        if addrs:
            grpc_addrs = {i: a for i, a in data.grpc_addrs.items() if i in addrs}
            self.broker_addr_table[broker_name] = BrokerData(cluster=data.cluster, broker_name=broker_name,
                                                             broker_addrs=addrs, grpc_addrs=grpc_addrs)
            return
        del self.broker_addr_table[broker_name]
        names = self.cluster_addr_table.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self.cluster_addr_table[cluster]
        for topic in [t for t, brokers in self.topic_queue_table.items() if broker_name in brokers]:
            self._remove_topic_broker(topic, broker_name)

    def scan_not_active_brokers(self, now_ms: int, expired_after_ms: int) -> list[str]:
        """Unregister every broker address silent for more than `expired_after_ms`; returns them."""
        expired = [addr for addr, live in self.broker_live_table.items()
                   if now_ms - live.last_update_ms > expired_after_ms]
        for addr in expired:
            live = self.broker_live_table[addr]
            self.unregister_broker(cluster=live.cluster, broker_name=live.broker_name, broker_addr=addr,
                                   broker_id=live.broker_id)
        return expired

    def topic_route(self, topic: str) -> TopicRouteData | None:
        """The topic's queues on every broker that serves it and those brokers' addresses, sorted by
        broker name; None when no live broker serves it."""
        brokers = self.topic_queue_table.get(topic)
        if not brokers:
            return None
        names = sorted(name for name in brokers if name in self.broker_addr_table)
        if not names:
            return None
        return TopicRouteData(queue_datas=[brokers[name] for name in names],
                              broker_datas=[self.broker_addr_table[name] for name in names])

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(broker_addr_table=dict(sorted(self.broker_addr_table.items())),
                           cluster_addr_table={c: sorted(n) for c, n in sorted(self.cluster_addr_table.items())})

    def all_topics(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def _remove_topic_broker(self, topic: str, broker_name: str) -> None:
        brokers = self.topic_queue_table[topic]
        brokers.pop(broker_name, None)
        if not brokers:
            del self.topic_queue_table[topic]
