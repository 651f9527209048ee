"""Client configuration: every option of RocketMQ's push consumer (REFERENCE.md §12) in snake_case,
with the same defaults. `PushConsumer(..., **options)` validates names and ranges against these."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

from conf.ranges import Range, check_ranges
from conf.tls import client_context


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Shared by producers and consumers of one client instance."""

    RANGES: ClassVar[Mapping[str, Range]] = MappingProxyType({"persist_offset_interval_ms": Range(low=1)})

    instance_name: str = "DEFAULT"               # client id is ip@<this>; "DEFAULT" becomes a unique pid#time
    heartbeat_interval_ms: int = 30_000          # heartbeatBrokerInterval
    poll_route_interval_ms: int = 30_000         # pollNameServerInterval
    persist_offset_interval_ms: int = 5_000      # persistConsumerOffsetInterval
    # RocketMQ's name of `persist_offset_interval_ms`; when set it wins (both set and different: ValueError)
    persist_consumer_offset_interval_ms: int | None = None
    rebalance_interval_ms: int = 20_000          # rocketmq.client.rebalance.waitInterval
    request_timeout_ms: int = 3_000              # mqClientApiTimeout
    connect_timeout_ms: int = 3_000              # an endpoint not answering a connect this long is unreachable
    metrics_host: str = "127.0.0.1"              # where a `metrics_port=` endpoint listens; "0.0.0.0" for all
    tls: bool = False                            # TLS to brokers and name servers, verified with the system's CAs
    ssl_context: ssl.SSLContext | None = None    # TLS with this context (own CA, client certificate); implies tls

    def __post_init__(self) -> None:
        _merge_alias(self, "persist_consumer_offset_interval_ms", "persist_offset_interval_ms", 5_000)
        check_ranges(self, self.RANGES)

    def connection_ssl_context(self) -> ssl.SSLContext | None:
        """The context of every connection: `ssl_context`, else one verifying servers against the
        system's CAs when `tls` (`SSL_CERT_FILE` names another bundle), else None (plaintext)."""
        if self.ssl_context is not None:
            return self.ssl_context
        return client_context() if self.tls else None


# The environment variables of the command-line clients (`rocketq admin`, `rocketq top`), by option.
# Broker and name-server configuration loading skips them: they share the ROCKETQ_ prefix.
CLIENT_ENV: Mapping[str, str] = MappingProxyType({
    "endpoints": "ROCKETQ_ENDPOINTS", "access_key": "ROCKETQ_ACCESS_KEY", "secret_key": "ROCKETQ_SECRET_KEY",
    "tls": "ROCKETQ_TLS", "ca_file": "ROCKETQ_CA_FILE", "cert_file": "ROCKETQ_CERT_FILE",
    "key_file": "ROCKETQ_KEY_FILE"})


def with_tls(config: ClientConfig | None, tls: bool, ssl_context: ssl.SSLContext | None) -> ClientConfig:
    """`config` (default `ClientConfig()`) with the `tls=` / `ssl_context=` keywords of `Producer`,
    `PushConsumer` and `PullConsumer` applied (each only when given: True / not None)."""
    config = config or ClientConfig()
    if tls and not config.tls:
        config = replace(config, tls=True)
    if ssl_context is not None:
        config = replace(config, ssl_context=ssl_context)
    return config


@dataclass(frozen=True, slots=True, kw_only=True)
class PushConsumerOptions:
    """Push-consumer options; ranges as RocketMQ's `checkConfig`; `consume_thread_min` must not be
    greater than `consume_thread_max`."""

    RANGES: ClassVar[Mapping[str, Range]] = MappingProxyType({
        "consume_thread_min": Range(1, 1000), "consume_thread_max": Range(1, 1000),
        "consume_concurrently_max_span": Range(1, 65535), "pull_threshold_for_queue": Range(1, 65535),
        "pull_threshold_size_for_queue": Range(1, 1024), "pull_threshold_for_topic": Range(1, 6_553_500, unset=-1),
        "pull_threshold_size_for_topic": Range(1, 102_400, unset=-1), "pull_interval_ms": Range(0, 65535),
        "consume_message_batch_max_size": Range(1, 1024), "pull_batch_size": Range(1, 1024),
        "await_termination_ms": Range(low=0), "lock_interval_ms": Range(low=0),
        "lock_max_live_time_ms": Range(low=0), "unlock_delay_time_ms": Range(low=0),
        "max_time_consume_continuously_ms": Range(low=0),
    })

    consume_thread_min: int = 20                 # checked as RocketMQ's; consume_thread_max is the bound
    consume_thread_max: int = 20                 # the concurrency bound of listener calls
    consume_concurrently_max_span: int = 2_000   # pulls pause while a queue's cached offsets span more than this
    pull_threshold_for_queue: int = 1_000        # pulls pause while a queue caches more messages than this
    pull_threshold_size_for_queue: int = 100     # MiB, compared with integer division as RocketMQ
    pull_threshold_for_topic: int = -1           # checked as RocketMQ's, not applied (-1: off)
    pull_threshold_size_for_topic: int = -1      # MiB; checked as RocketMQ's, not applied (-1: off)
    pull_interval_ms: int = 0                    # wait between two pulls of a queue
    consume_message_batch_max_size: int = 1      # most messages per listener call
    pull_batch_size: int = 32                    # most messages asked for by one pull
    post_subscription_when_pull: bool = False    # send the subscription with every pull (RocketMQ's option)
    max_reconsume_times: int = -1                # -1: 16 (concurrent), unlimited (orderly)
    suspend_current_queue_time_ms: int = 1_000   # orderly: SUSPEND_CURRENT_QUEUE_A_MOMENT's default pause
    consume_timeout_minutes: float = 15          # a fraction is allowed (tests use 0.01)
    await_termination_ms: int = 0                # a graceful stop waits this long for running listener calls
    # RocketMQ's name of `await_termination_ms`; when set it wins (both set and different: ValueError)
    await_termination_millis_when_shutdown: int | None = None
    consume_timestamp: str = ""                  # yyyyMMddHHmmss local time; "" = 30 min before start
    broker_suspend_max_ms: int = 15_000          # BROKER_SUSPEND_MAX_TIME_MILLIS
    consumer_timeout_when_suspend_ms: int = 30_000   # the client's timeout of a held pull
    pull_time_delay_when_exception_ms: int = 3_000   # a failed pull (or one waiting for its lock) waits this
    pull_time_delay_when_flow_control_ms: int = 50   # a pull put off by flow control is tried again after this
    pull_time_delay_when_suspend_ms: int = 1_000     # while the consumer is paused, its pulls wait this
    pull_max_idle_time_ms: int = 120_000         # rocketmq.client.pull.pullMaxIdleTime: a pull loop this idle restarts
    reconsume_later_delay_ms: int = 5_000        # local retry when the send-back and the resend both fail
    offset_store_dir: Path | None = None         # broadcasting offsets; default ~/.rocketq/offsets
    metrics_port: int = 0                        # > 0: serve this client's Prometheus metrics there; 0: off
    # Orderly consumption (RocketMQ's system properties rocketmq.client.rebalance.lockInterval,
    # .lockMaxLiveTime, rocketmq.client.unlockDelayTimeMills, .maxTimeConsumeContinuously). Keep
    # lock_max_live_time_ms below the broker's lock_max_live_ms (60 s) and above lock_interval_ms.

    lock_interval_ms: int = 20_000               # how often the queue locks are renewed
    lock_max_live_time_ms: int = 30_000          # how long a renewed lock is trusted here
    unlock_delay_time_ms: int = 20_000           # a dropped queue with cached messages is unlocked after this
    max_time_consume_continuously_ms: int = 60_000   # a queue yields to the others after this much work

    def __post_init__(self) -> None:
        _merge_alias(self, "await_termination_millis_when_shutdown", "await_termination_ms", 0)
        check_ranges(self, self.RANGES)
        if self.consume_thread_min > self.consume_thread_max:
            raise ValueError(f"consume_thread_min ({self.consume_thread_min}) must not be greater than "
                             f"consume_thread_max ({self.consume_thread_max}); set both")


def _merge_alias(config: object, alias: str, name: str, default: int) -> None:
    """Copy the RocketMQ-named `alias` field into `name` when it is set; ValueError when `name` was
    also set (differs from its `default`) to another value."""
    value = getattr(config, alias)
    if value is None:
        return
    current = getattr(config, name)
    if current not in (default, value):
        raise ValueError(f"{alias} = {value} contradicts {name} = {current}; set one of them")
    object.__setattr__(config, name, value)


def option_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
