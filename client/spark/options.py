"""The options of the `rocketq` Spark source and sink, and the pure offset arithmetic they need.

No pyspark and no I/O here: option maps in, frozen values out. Option names are Spark's camelCase
(as the Kafka source spells its own); Spark hands them over case-insensitively, so lookups here are
case-insensitive too. Every bad value raises `ValueError` naming the option.

Offsets are queue offsets (the index of a message in its consume queue), one per queue of the
topic, a queue being named by `(broker_name, queue_id)` (a topic may be served by several brokers).
A per-queue offset map is written as JSON, broker name then queue id as string keys, keys sorted
at both levels: `{"broker-a": {"0": 42, "1": 17}, "broker-b": {"0": 5}}`. Sorting matters: Spark
compares a micro-batch's start and end offsets as JSON text, so the same offsets in another key
order would look like new data and run an empty batch.

The earlier one-level form `{"0": 42, "1": 17}` (queue id → offset, from when the source read
topics of one broker only) is still accepted, in options and in checkpoints: its queues are held
under the broker name `LEGACY_BROKER` ("") until `bind_legacy` names the topic's only broker."""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from client.instance import parse_endpoints
from conf.tls import client_context
from protocol.model import ExpressionType
from protocol.signing import Credentials
from protocol.subscription import SUB_ALL, is_subscribe_all, parse_tags

EARLIEST = -2            # in an offsets JSON, as the Kafka source: the queue's min offset
LATEST = -1              # the queue's max offset (the offset the next message will get)
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000   # Spark spends ~50 ms per Python task on top of the read
DEFAULT_PULL_BATCH_SIZE = 32       # the broker answers at most max_transfer_count_on_message_in_memory
DEFAULT_PULL_DEPTH = 8             # pulls in flight per partition
DEFAULT_PULL_TIMEOUT_MS = 10_000
DEFAULT_ARROW_BATCH_ROWS = 8_192


class Bound(Enum):
    EARLIEST = "earliest"
    LATEST = "latest"


QueueKey = tuple[str, int]               # (broker_name, queue_id): one queue of a topic
OffsetSpec = Bound | dict[QueueKey, int]   # "earliest" / "latest", or queue → offset (EARLIEST/LATEST allowed)
LEGACY_BROKER = ""                       # the broker of a queue named by queue id alone (the old JSON form)
DEFAULT_BROKER_WAIT_MS = 120_000         # how long a broker that does not answer is waited for
K = TypeVar("K", int, QueueKey)


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in options.items()}


def _int_option(options: dict[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"option {name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ValueError(f"option {name} must be at least {minimum}, not {value}")
    return value


def _bool_option(options: dict[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name} must be true or false, not {raw!r}")


def credentials_option(options: dict[str, str]) -> Credentials | None:
    """`accessKey` and `secretKey` (a user and its password: every request is then signed), None
    when neither is given; raises `ValueError` when only one is."""
    access_key, secret_key = options.get("accesskey") or "", options.get("secretkey") or ""
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise ValueError("options accessKey and secretKey go together")
    return Credentials(access_key, secret_key)


def _queue_offsets(value: Mapping[str, object], minimum: int) -> dict[QueueKey, int] | None:
    """`value` read as {broker: {queue id: offset}} or the legacy {queue id: offset} (under
    `LEGACY_BROKER`), every offset an int >= `minimum`; None when it is neither."""
    offsets: dict[QueueKey, int] = {}
    for key, item in value.items():
        if isinstance(item, Mapping):
            for queue_id, offset in item.items():
                if not str(queue_id).isdigit() or type(offset) is not int or offset < minimum:
                    return None
                offsets[(str(key), int(queue_id))] = offset
        elif str(key).isdigit() and type(item) is int and item >= minimum:
            offsets[(LEGACY_BROKER, int(key))] = item
        else:
            return None
    return offsets


def parse_offset_spec(name: str, raw: str) -> OffsetSpec:
    """`earliest`, `latest`, or a JSON object of broker name → queue id → queue offset where -2
    means earliest and -1 latest (`{"broker-a": {"0": 10, "3": -2}}`); the legacy form queue id →
    offset (`{"0": 10}`) is held under `LEGACY_BROKER`. Raises `ValueError` for anything else."""
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return Bound(text.lower())
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"option {name} must be earliest, latest or a JSON object of broker name → queue id "
                         f"→ offset, not {raw!r}") from None
    offsets = _queue_offsets(value, EARLIEST) if isinstance(value, dict) else None
    if offsets is None:
        raise ValueError(f"option {name} must be a JSON object of broker name → queue id → offset (>= 0, or -2 "
                         f"for earliest, -1 for latest), not {raw!r}")
    return offsets


def offsets_to_json(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, int]]:
    """The checkpointed form of per-queue offsets: broker name → queue id → offset, string keys in
    sorted order at both levels (see the module doc)."""
    nested: dict[str, dict[str, int]] = {}
    for (broker_name, queue_id), offset in offsets.items():
        nested.setdefault(broker_name, {})[str(queue_id)] = offset
    return {broker: dict(sorted(nested[broker].items())) for broker in sorted(nested)}


def offsets_from_json(value: Mapping[str, object]) -> dict[QueueKey, int]:
    """Inverse of `offsets_to_json`, also reading the legacy one-level form (its queues under
    `LEGACY_BROKER`: see `bind_legacy`); raises `ValueError` for anything else."""
    offsets = _queue_offsets(value, 0)
    if offsets is None:
        raise ValueError(f"not a rocketq offset map: {dict(value)!r}")
    return offsets


def bind_legacy(offsets: dict[QueueKey, int], topic: str, broker_names: Sequence[str]) -> dict[QueueKey, int]:
    """`offsets` with the queues of the legacy form (`LEGACY_BROKER`) given to the topic's only
    broker; unchanged when it has none. Raises `ValueError` when the topic is served by several
    brokers (or none): queue ids alone do not say which broker's queues they were."""
    if not any(broker == LEGACY_BROKER for broker, _ in offsets):
        return offsets
    if len(broker_names) != 1:
        raise ValueError(f"offsets {offsets_to_json(offsets)[LEGACY_BROKER]} name queues by queue id alone, but "
                         f"topic {topic!r} is served by {len(broker_names)} brokers ({', '.join(broker_names)}): "
                         "write them as {\"<broker_name>\": {\"<queue_id>\": offset}}")
    (only,) = broker_names
    return {(only if broker == LEGACY_BROKER else broker, queue_id): offset
            for (broker, queue_id), offset in offsets.items()}


@dataclass(frozen=True, slots=True)
class Filter:
    """What the broker filters by: a TAG expression or an SQL92 one (`expression_type`)."""

    expression_type: str = ExpressionType.TAG
    expression: str = SUB_ALL

    @property
    def tags(self) -> frozenset[str] | None:
        """The tag strings to re-check on the client (tags codes collide), None for no TAG filter."""
        if self.expression_type != ExpressionType.TAG or is_subscribe_all(self.expression):
            return None
        return parse_tags(self.expression)


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS to brokers and name servers: `enabled` (option `tls`), servers verified against `ca_file`
    (option `caFile`, which implies `tls`; "": the system's CAs), presenting the client certificate
    `cert_file` (option `certFile`, implies `tls`) with its key `key_file` (option `keyFile`; "":
    in `cert_file`) to servers that require one (mutual TLS). Plain data: executors get it pickled
    and build their own `ssl.SSLContext` (`context()`)."""

    enabled: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    @classmethod
    def parse(cls, opts: dict[str, str]) -> TlsSettings:
        """From lower-cased options; raises `ValueError` for a `tls` that is not a boolean or a
        `keyFile` without a `certFile`."""
        ca_file, cert_file, key_file = opts.get("cafile") or "", opts.get("certfile") or "", opts.get("keyfile") or ""
        if key_file and not cert_file:
            raise ValueError("option keyFile needs certFile (the client certificate)")
        return cls(enabled=_bool_option(opts, "tls", False) or bool(ca_file) or bool(cert_file), ca_file=ca_file,
                   cert_file=cert_file, key_file=key_file)

    def context(self) -> ssl.SSLContext | None:
        """The client context these settings describe (None: plaintext); raises `TlsError` when a
        file cannot be read."""
        return client_context(self.ca_file, self.cert_file, self.key_file) if self.enabled else None


NO_TLS = TlsSettings()


@dataclass(frozen=True, slots=True)
class PullSettings:
    """How an executor pulls one range: `batch_size` messages asked per pull, `depth` pulls in
    flight, `timeout_ms` per pull, `arrow_batch_rows` rows per yielded Arrow batch;
    `broker_wait_ms` (option `brokerWaitTimeoutMs`): how long a broker that does not answer
    (connection refused or closed, request timeout) is retried, by the driver planning a batch and
    by a task pulling its range, before the read fails — its queues are never skipped."""

    batch_size: int = DEFAULT_PULL_BATCH_SIZE
    depth: int = DEFAULT_PULL_DEPTH
    timeout_ms: int = DEFAULT_PULL_TIMEOUT_MS
    arrow_batch_rows: int = DEFAULT_ARROW_BATCH_ROWS
    fail_on_data_loss: bool = True
    broker_wait_ms: int = DEFAULT_BROKER_WAIT_MS


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Everything the source reads from its options. `starting` is None when `starting_timestamp_ms`
    is set; `ending` applies to batch reads only; `credentials` (accessKey, secretKey) sign every
    request of the driver and of each task (Spark pickles them into the tasks)."""

    endpoints: tuple[str, ...]
    topic: str
    starting: OffsetSpec | None
    starting_timestamp_ms: int | None
    ending: OffsetSpec
    filter: Filter
    max_records_per_partition: int
    max_records_per_trigger: int | None
    commit_to_group: str | None
    pull: PullSettings
    credentials: Credentials | None = None
    tls: TlsSettings = NO_TLS

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """Options of a read; `startingOffsets` defaults to earliest for a batch read and latest for
        a stream, as the Kafka source's. Raises `ValueError` for a missing or bad option."""
        opts = _lower(options)
        endpoints = opts.get("endpoints", "")
        topic = opts.get("topic", "")
        if not endpoints:
            raise ValueError("option endpoints is required (\"host:port;host:port\")")
        if not topic:
            raise ValueError("option topic is required")
        starting_raw, timestamp_raw = opts.get("startingoffsets"), opts.get("startingtimestamp")
        if starting_raw is not None and timestamp_raw is not None:
            raise ValueError("give startingOffsets or startingTimestamp, not both")
        timestamp_ms = None
        starting: OffsetSpec | None = Bound.LATEST if streaming else Bound.EARLIEST
        if timestamp_raw is not None:
            timestamp_ms, starting = _int_option(opts, "startingTimestamp", 0, minimum=0), None
        elif starting_raw is not None:
            starting = parse_offset_spec("startingOffsets", starting_raw)
        ending_raw = opts.get("endingoffsets")
        if streaming and ending_raw is not None:
            raise ValueError("option endingOffsets applies to batch reads only")
        ending = parse_offset_spec("endingOffsets", ending_raw) if ending_raw is not None else Bound.LATEST
        tags, sql = opts.get("tags"), opts.get("sql")
        if tags is not None and sql is not None:
            raise ValueError("give tags or sql, not both")
        if sql is not None:
            if not sql.strip():
                raise ValueError("option sql must not be empty")
            message_filter = Filter(ExpressionType.SQL92, sql)
        else:
            message_filter = Filter(ExpressionType.TAG, tags if tags is not None else SUB_ALL)
            message_filter.tags  # noqa: B018 (parse now: a bad expression fails on the driver)
        max_per_trigger = _int_option(opts, "maxRecordsPerTrigger", 0)
        pull = PullSettings(
            batch_size=_int_option(opts, "pullBatchSize", DEFAULT_PULL_BATCH_SIZE),
            depth=_int_option(opts, "pullDepth", DEFAULT_PULL_DEPTH),
            timeout_ms=_int_option(opts, "pullTimeoutMs", DEFAULT_PULL_TIMEOUT_MS),
            arrow_batch_rows=_int_option(opts, "arrowBatchRows", DEFAULT_ARROW_BATCH_ROWS),
            fail_on_data_loss=_bool_option(opts, "failOnDataLoss", True),
            broker_wait_ms=_int_option(opts, "brokerWaitTimeoutMs", DEFAULT_BROKER_WAIT_MS, minimum=0))
        return cls(endpoints=tuple(parse_endpoints(endpoints)), topic=topic, starting=starting,
                   starting_timestamp_ms=timestamp_ms, ending=ending, filter=message_filter,
                   max_records_per_partition=_int_option(opts, "maxRecordsPerPartition",
                                                         DEFAULT_MAX_RECORDS_PER_PARTITION),
                   max_records_per_trigger=max_per_trigger or None,
                   commit_to_group=opts.get("committogroup") or None, pull=pull,
                   credentials=credentials_option(opts), tls=TlsSettings.parse(opts))


@dataclass(frozen=True, slots=True)
class SinkOptions:
    endpoints: tuple[str, ...]
    topic: str
    producer_group: str
    send_batch_size: int
    sends_in_flight: int
    send_timeout_ms: int
    credentials: Credentials | None = None
    tls: TlsSettings = NO_TLS
    dedup: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Options of a write: endpoints, topic, producerGroup (default "spark-sink"),
        sendBatchSize messages per SEND_BATCH_MESSAGE (32), sendsInFlight (8), sendTimeoutMs,
        accessKey and secretKey (the producer's credentials), tls, caFile, certFile and keyFile (as
        the source's), dedup (true: each row carries the DEDUP property, for exactly-once on brokers
        with `store.dedup_window_ms` on)."""
        opts = _lower(options)
        endpoints, topic = opts.get("endpoints", ""), opts.get("topic", "")
        if not endpoints:
            raise ValueError("option endpoints is required (\"host:port;host:port\")")
        if not topic:
            raise ValueError("option topic is required")
        return cls(endpoints=tuple(parse_endpoints(endpoints)), topic=topic,
                   producer_group=opts.get("producergroup") or "spark-sink",
                   send_batch_size=_int_option(opts, "sendBatchSize", 32),
                   sends_in_flight=_int_option(opts, "sendsInFlight", 8),
                   send_timeout_ms=_int_option(opts, "sendTimeoutMs", 10_000),
                   credentials=credentials_option(opts), tls=TlsSettings.parse(opts),
                   dedup=_bool_option(opts, "dedup", True))


# -- pure offset arithmetic --------------------------------------------------------------------------


def resolve_offset(requested: int, min_offset: int, max_offset: int) -> int:
    """An offsets-JSON value made concrete: -2 → `min_offset`, -1 → `max_offset`, any other value
    clamped into [min_offset, max_offset]."""
    if requested == EARLIEST:
        return min_offset
    if requested == LATEST:
        return max_offset
    return min(max(requested, min_offset), max_offset)


def split_range(start: int, end: int, max_records: int) -> list[tuple[int, int]]:
    """[start, end) cut into consecutive ranges of at most `max_records` offsets, of near-equal size
    ([] when empty). `split_range(0, 10, 4)` → [(0, 4), (4, 7), (7, 10)]."""
    count = end - start
    if count <= 0:
        return []
    pieces = -(-count // max_records)
    size, extra = divmod(count, pieces)
    ranges, low = [], start
    for index in range(pieces):
        high = low + size + (1 if index < extra else 0)
        ranges.append((low, high))
        low = high
    return ranges


def admit(start: Mapping[K, int], latest: Mapping[K, int], max_records: int | None) -> dict[K, int]:
    """The end offsets of the next micro-batch: `latest` when `max_records` is None, else at most
    `max_records` offsets in all, shared in proportion to each queue's backlog (largest remainders
    first, ties to the lower queue), as the Kafka source's `maxOffsetsPerTrigger`. A queue
    missing from `start` starts at 0 here; every end is >= its start, and the ends admit exactly
    min(max_records, total backlog) offsets."""
    backlog = {q: max(latest[q] - start.get(q, 0), 0) for q in latest}
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return {q: start.get(q, 0) + backlog[q] for q in latest}
    shares = {q: backlog[q] * max_records // total for q in backlog}
    remainders = sorted(backlog, key=lambda q: (-(backlog[q] * max_records % total), q))
    left = max_records - sum(shares.values())
    for q in remainders:
        if left == 0:
            break
        if shares[q] < backlog[q]:
            shares[q] += 1
            left -= 1
    return {q: start.get(q, 0) + shares[q] for q in latest}
