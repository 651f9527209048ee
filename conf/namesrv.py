"""Name server configuration (RocketMQ `NamesrvConfig` / `NettyServerConfig`): typed, frozen, one
default per field (see conf/namesrv.toml). Environment variables use the prefix
`ROCKETQ_NAMESRV__` (e.g. `ROCKETQ_NAMESRV__LISTEN_PORT=9877`), so they never reach a broker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from conf.auth import AuthConfig
from conf.tls import TlsConfig

ENV_PREFIX = "ROCKETQ_NAMESRV__"
EventLoop = Literal["auto", "asyncio", "uvloop"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NamesrvConfig:
    listen_host: str = "127.0.0.1"                     # address for brokers and clients; "0.0.0.0" for all
    listen_port: int = 9876                            # TCP port (RocketMQ's default name server port)
    scan_not_active_broker_interval_ms: int = 10_000   # how often silent brokers are looked for
    broker_channel_expired_time_ms: int = 120_000      # BROKER_CHANNEL_EXPIRED_TIME: silent longer -> removed
    max_frame_bytes: int = 16 * 1024 * 1024            # largest frame accepted
    graceful_shutdown_timeout_ms: int = 5_000          # on SIGTERM, requests in flight get this long
    metrics_port: int = 0                              # 0: no metrics endpoint (5557 is the broker's)
    event_loop: EventLoop = "auto"                     # "auto" (uvloop when installed), "asyncio" or "uvloop"
    config_dir: str = "~/.rocketq/namesrv"             # the name server's files (auth.json); RocketMQ: ~/namesrv
    protected_mode: bool = True                        # auth off and listening beyond loopback: refuse others
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)


def parse_namesrv_addr(text: str) -> list[str]:
    """`"h1:9876;h2:9876"` -> `["h1:9876", "h2:9876"]` (`;` or `,` separated, blanks dropped);
    raises `ValueError` for an entry that is not host:port."""
    addresses = [item.strip() for item in text.replace(",", ";").split(";") if item.strip()]
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"namesrv_addr entry {address!r} is not host:port")
    return addresses
