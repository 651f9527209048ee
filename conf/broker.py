"""Broker configuration: typed, frozen, one default per field (see conf/broker.toml)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Literal

from conf.auth import AuthConfig
from conf.ranges import Range, check_ranges
from conf.store import StoreConfig
from conf.tls import TlsConfig
from conf.trace import TraceConfig

EventLoop = Literal["auto", "asyncio", "uvloop"]
BrokerRole = Literal["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LongPollingConfig:
    enable: bool = True                  # hold a pull with no new messages until one arrives (or it times out)
    short_polling_time_ms: int = 1_000   # how long a pull is held when long polling is off
    check_interval_ms: int = 5_000       # safety sweep of held pulls; wake-ups do not depend on it


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    RANGES: ClassVar[Mapping[str, Range]] = MappingProxyType({
        "max_requests_per_step": Range(low=0), "transaction_timeout_ms": Range(0, 86_400_000),
        "transaction_check_interval_ms": Range(10, 86_400_000), "transaction_check_max": Range(1, 1_000),
        "timer_max_delay_sec": Range(low=1, high=400 * 86_400),
        "timer_precision_ms": Range(low=1, high=1_000), "timer_roll_window_slots": Range(low=1),
        "pop_max_in_flight_per_queue": Range(low=1), "pop_revive_interval_ms": Range(low=1),
        "broker_id": Range(0, 1_000), "grpc_port": Range(0, 65_535), "grpc_max_concurrent_calls": Range(1, 1_000_000),
        "ha_listen_port": Range(-1, 65_535), "in_sync_replicas_min": Range(1, 16),
        "ha_max_gap_bytes": Range(low=1), "ha_window_bytes": Range(4_096, 256 * 1024 * 1024),
        "ha_heartbeat_interval_ms": Range(10, 60_000), "ha_housekeeping_timeout_ms": Range(100, 600_000),
        "ha_slave_sync_interval_ms": Range(10, 600_000), "controller_heartbeat_interval_ms": Range(50, 60_000)})

    listen_host: str = "127.0.0.1"                # address clients connect to; "0.0.0.0" for all interfaces
    listen_port: int = 10911                      # TCP port (RocketMQ's default); 0 picks a free port
    broker_name: str = "broker-a"                 # brokerName; part of every MessageQueue clients see
    cluster_name: str = "DefaultCluster"          # brokerClusterName
    namesrv_addr: str = ""                        # "host:port;host:port": name servers to register with
    register_name_server_period_ms: int = 30_000  # registerNameServerPeriod (RocketMQ clamps to 10-60 s)
    graceful_shutdown_timeout_ms: int = 5_000     # on SIGTERM/SIGINT: wait this long for in-flight work, then cancel
    max_frame_bytes: int = 16 * 1024 * 1024       # largest frame accepted; a larger one closes the connection
    max_properties_bytes: int = 32_767            # a message's properties as RocketMQ's string; over: MESSAGE_ILLEGAL
    max_in_flight_per_connection: int = 4096      # requests awaiting an answer; past it that connection is not read
    max_requests_per_step: int = 8                # one connection's requests handled per loop step; 0: all read
    frame_read_timeout_ms: int = 30_000           # a started frame must complete within this, else closed
    max_connections: int = 10_000                 # more connections are refused (SYSTEM_BUSY frame, closed)
    max_connections_per_address: int = 1_000      # connections from one peer IP (loopback too); 0: no cap
    max_buffered_bytes: int = 256 * 1024 * 1024   # unsent bytes of all connections; past it reads pause
    max_unsent_bytes_per_connection: int = 4 * 1024 * 1024   # one connection's unsent bytes; over: unread till 1/4
    close_unsent_bytes_per_connection: int = 64 * 1024 * 1024   # past this a connection is closed
    write_stall_timeout_ms: int = 60_000          # unread responses that made no progress this long: closed
    event_loop: EventLoop = "auto"                # "auto": uvloop if installed, else asyncio
    metrics_port: int = 5557                      # Prometheus /metrics on listen_host (RocketMQ 5's); 0: off
    grpc_port: int = 8081                         # RocketMQ 5's gRPC API (the proxy's port) on listen_host; 0: off
    grpc_max_concurrent_calls: int = 10_000       # gRPC calls at once (held receives count); more: RESOURCE_EXHAUSTED
    metrics_max_label_sets: int = 10_000          # label sets per metric (topic, group, ...); more count as "other"
    auto_create_topic: bool = True                # create a topic on its first send (autoCreateTopicEnable)
    auto_create_subscription_group: bool = True   # create a group on first use (autoCreateSubscriptionGroup)
    default_queue_nums: int = 4                   # queues of an auto-created topic (defaultTopicQueueNums)
    channel_expired_timeout_ms: int = 120_000     # CHANNEL_EXPIRED_TIMEOUT; also any connection silent this long
    housekeeping_interval_ms: int = 10_000        # how often idle client connections are looked for
    lock_max_live_ms: int = 60_000                # orderly consumption: a queue lock not renewed this long expires
    persist_interval_ms: int = 5_000              # topics, groups, offsets → <store>/config/
    pop_max_in_flight_per_queue: int = 2_000      # POP: unacked (+ revived) per group and queue; past it no new ones
    pop_revive_interval_ms: int = 100             # POP: how often messages past their invisible time are revived
    notify_consumer_ids_changed_enable: bool = True   # tell a group to rebalance when a member joins or leaves
    notify_consumer_ids_changed_interval_ms: int = 500   # notice rounds of a group are counted per window
    notify_consumer_ids_changed_max_rounds: int = 4      # rounds sent at once per window; later changes: one at its end
    max_consumers_per_group: int = 1_000          # a heartbeat joining a full group: SYSTEM_BUSY; 0: no bound
    max_client_ids_per_address: int = 100         # distinct client ids connected from one host; 0: no bound
    filter_support_sql92: bool = True             # SQL92 subscriptions (RocketMQ enablePropertyFilter, off there)
    filter_support_retry: bool = False            # filter retried messages by the group's SQL92 expression
    sql92_max_expression_bytes: int = 65_536      # longer SQL92 expressions are refused (RocketMQ: no bound)
    sql92_max_depth: int = 64                     # parentheses / NOT / sign nesting of an SQL92 expression
    sql92_max_terms: int = 1_024                  # conditions joined by AND / OR in one SQL92 expression
    sql92_compile_cache_bytes: int = 32 * 1024 * 1024  # compiled SQL92 expressions kept, by estimated size
    transaction_timeout_ms: int = 6_000           # a half message unresolved this long is checked back
    transaction_check_interval_ms: int = 60_000   # how often pending half messages are scanned
    transaction_check_max: int = 15               # check-backs before a half message is dropped (and counted)
    timer_max_delay_sec: int = 259_200            # timer messages: latest deliver time ahead (3 days); more: refused
    timer_precision_ms: int = 100                 # timer wheel slot (timerPrecisionMs); changing it needs a new wheel
    timer_roll_window_slots: int = 1_728_000      # timerRollWindowSlots: due later than this many slots ahead: rolled
    protected_mode: bool = True                   # auth off and listening beyond loopback: refuse non-loopback peers
    # High availability (RocketMQ's HAService, docs/ha.md): brokers with one broker_name form a replica set.
    broker_id: int = 0                            # brokerId: 0 the master, 1 and up its slaves
    broker_role: BrokerRole = "ASYNC_MASTER"      # brokerRole; SYNC_MASTER: a send is acked on in_sync_replicas_min
    ha_listen_port: int = -1                      # haListenPort of a master's log stream; 0: any; -1: listen_port + 1
    in_sync_replicas_min: int = 2                 # SYNC_MASTER: replicas (the master included) a send must be on
    ha_max_gap_bytes: int = 256 * 1024 * 1024     # haMaxGapNotInSync: a slave further behind leaves the in-sync set
    ha_master_address: str = ""                   # SLAVE: the master's "host:ha_port"; "" = ask the name servers
    ha_window_bytes: int = 4 * 1024 * 1024        # commit-log bytes a master sends a slave ahead of its ack
    ha_heartbeat_interval_ms: int = 1_000         # idle stream: a master heartbeat and a slave ack this often
    ha_housekeeping_timeout_ms: int = 20_000      # haHousekeepingInterval: a silent replication connection is closed
    controller_addr: str = ""                     # controllerAddr "h:p[;h:p]": automatic failover (docs/ha.md)
    controller_heartbeat_interval_ms: int = 1_000 # how often a broker reports to the controller
    controller_master_role: str = ""              # a SLAVE elected master: SYNC_MASTER ("") or ASYNC_MASTER
    ha_slave_sync_interval_ms: int = 1_000        # topics, groups, offsets sent to slaves (when changed) this often
    slave_read_enable: bool = False               # slaveReadEnable: pulls far behind the log end are sent to a slave
    long_polling: LongPollingConfig = field(default_factory=LongPollingConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES)
        check_ha_roles(self)

    @property
    def is_slave(self) -> bool:
        return self.broker_role == "SLAVE"


def check_ha_roles(config: BrokerConfig) -> None:
    """Raise `ValueError` for a role that contradicts its broker_id (RocketMQ's BrokerStartup sets
    brokerId 0 for a master and refuses a slave with id 0), an unknown role, or an
    `in_sync_replicas_min` a lone master could never meet with no slave (1 is the master alone)."""
    if config.broker_role not in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"):
        raise ValueError(f"broker_role must be ASYNC_MASTER, SYNC_MASTER or SLAVE, got {config.broker_role!r}")
    if config.broker_role == "SLAVE" and config.broker_id == 0:
        raise ValueError("broker_role SLAVE needs broker_id >= 1 (broker_id 0 is the master of a replica set)")
    if config.broker_role != "SLAVE" and config.broker_id != 0:
        raise ValueError(f"broker_role {config.broker_role} needs broker_id 0, got {config.broker_id} "
                         f"(ids 1 and up are slaves)")
    if config.controller_master_role not in ("", "SYNC_MASTER", "ASYNC_MASTER"):
        raise ValueError(f"controller_master_role must be SYNC_MASTER or ASYNC_MASTER, got "
                         f"{config.controller_master_role!r}")
    if config.ha_master_address and ":" not in config.ha_master_address:
        raise ValueError(f"ha_master_address must be host:port, got {config.ha_master_address!r}")
