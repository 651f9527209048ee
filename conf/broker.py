"""Broker configuration: typed, frozen, one default per field (see conf/broker.toml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from conf.store import StoreConfig

EventLoop = Literal["auto", "asyncio", "uvloop"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LongPollingConfig:
    enable: bool = True
    short_polling_time_ms: int = 1_000   # how long a pull is held when long polling is off
    check_interval_ms: int = 5_000       # safety sweep of held pulls; wake-ups do not depend on it


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 10911
    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    namesrv_addr: str = ""                        # "host:port;host:port": name servers to register with
    register_name_server_period_ms: int = 30_000  # registerNameServerPeriod (RocketMQ clamps to 10-60 s)
    graceful_shutdown_timeout_ms: int = 5_000
    max_frame_bytes: int = 16 * 1024 * 1024
    max_properties_bytes: int = 32_767            # a message's properties as RocketMQ's string; over: MESSAGE_ILLEGAL
    max_in_flight_per_connection: int = 4096      # requests awaiting an answer; past it that connection is not read
    max_requests_per_step: int = 8                # one connection's requests handled per loop step; 0: all read
    frame_read_timeout_ms: int = 30_000           # a started frame must complete within this, else closed
    max_connections: int = 10_000                 # more connections are refused (SYSTEM_BUSY frame, closed)
    max_connections_per_address: int = 1_000      # connections from one peer IP (loopback too); 0: no cap
    max_buffered_bytes: int = 256 * 1024 * 1024   # unsent bytes (below) of all connections; past it reads pause
    max_unsent_bytes_per_connection: int = 4 * 1024 * 1024   # partial frame + unread responses + unanswered
                                                  # requests of one connection; past it it is not read until < 1/4
    close_unsent_bytes_per_connection: int = 64 * 1024 * 1024   # past this a connection is closed
    write_stall_timeout_ms: int = 60_000          # unread responses that made no progress this long: closed
    event_loop: EventLoop = "auto"
    metrics_port: int = 5557                      # Prometheus /metrics on listen_host (RocketMQ 5's); 0: off
    auto_create_topic: bool = True
    auto_create_subscription_group: bool = True
    default_queue_nums: int = 4
    channel_expired_timeout_ms: int = 120_000     # CHANNEL_EXPIRED_TIMEOUT; also any connection silent this long
    housekeeping_interval_ms: int = 10_000
    lock_max_live_ms: int = 60_000
    persist_interval_ms: int = 5_000              # topics, groups, offsets → <store>/config/
    notify_consumer_ids_changed_enable: bool = True
    filter_support_sql92: bool = True             # SQL92 subscriptions (RocketMQ enablePropertyFilter, off there)
    filter_support_retry: bool = False            # filter retried messages by the group's SQL92 expression
    long_polling: LongPollingConfig = field(default_factory=LongPollingConfig)
    store: StoreConfig = field(default_factory=StoreConfig)

    def __post_init__(self) -> None:
        if self.max_requests_per_step < 0:
            raise ValueError(f"max_requests_per_step must be 0 (no bound) or positive, "
                             f"got {self.max_requests_per_step}")
