"""Controller configuration (RocketMQ `ControllerConfig`): typed, frozen, one default per field.
Environment variables use the prefix `ROCKETQ_CONTROLLER__`."""

from __future__ import annotations

from dataclasses import dataclass, field

from conf.auth import AuthConfig

ENV_PREFIX = "ROCKETQ_CONTROLLER__"


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerConfig:
    listen_host: str = "127.0.0.1"          # address brokers reach this controller on
    listen_port: int = 9878                 # brokers' port; Raft among controllers uses listen_port + raft_port_offset
    raft_port_offset: int = 1               # Raft port = the broker-facing port + this (in --peers too)
    peers: str = ""                         # "id1=h:p,id2=h:p,id3=h:p" (broker-facing addresses); "": alone
    node_id: str = ""                       # this controller's id in peers; "": the entry with listen_port
    data_dir: str = ""                      # Raft journal and snapshot; "": in memory (lost at a restart)
    broker_lease_ms: int = 6_000            # a master silent this long is replaced (controllerBrokerTimeoutMills)
    scan_interval_ms: int = 500             # how often the leader looks for silent masters
    max_frame_bytes: int = 1024 * 1024      # largest request accepted
    graceful_shutdown_timeout_ms: int = 3_000  # on SIGTERM, requests in flight get this long
    event_loop: str = "auto"                # "auto", "asyncio" or "uvloop"
    config_dir: str = "~/.rocketq/controller"   # the controller's files (auth.json)
    auth: AuthConfig = field(default_factory=AuthConfig)   # on: brokers sign with auth.inner_credentials
    metrics_port: int = 0                   # 0 only: a controller serves no metrics yet (tools set it for every daemon)

    def __post_init__(self) -> None:
        if self.broker_lease_ms < 100 or self.scan_interval_ms < 10:
            raise ValueError("broker_lease_ms must be >= 100 and scan_interval_ms >= 10")
        parse_peers(self.peers)


def parse_peers(text: str) -> dict[str, str]:
    """`"c1=h:p,c2=h:p"` -> {"c1": "h:p", ...}; raises `ValueError` for a malformed entry."""
    peers: dict[str, str] = {}
    for item in (part.strip() for part in text.replace(";", ",").split(",")):
        if not item:
            continue
        node, sep, address = item.partition("=")
        host, colon, port = address.rpartition(":")
        if not sep or not node or not colon or not host or not port.isdigit():
            raise ValueError(f"peers entry {item!r} is not id=host:port")
        peers[node] = address
    return peers
