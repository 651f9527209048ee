"""`python -m bench [--quick] [--only NAME]...`: run the benchmarks, print the table, write
`bench/results/<name>.json` and `bench/results/summary.json`.

Exit code: 0 when every benchmark ran and its checks held (a missed target is only marked FAIL in
the table), 1 when a benchmark failed (an error or a failed correctness check)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from bench import (
    auth,
    client_consume,
    client_produce,
    cluster,
    console,
    filtered_pull,
    grpc_client,
    ha,
    ha_failover,
    held,
    latency,
    orderly_consume,
    pop,
    pull,
    replay,
    retry,
    send,
    spark,
    spark_cluster,
    sql92,
    timer,
    tls,
    trace,
    txn_send,
)
from bench.common import Options, run, wait_for_quiet
from bench.report import BenchResult, cpu_idle_line, format_table, write_result, write_summary

Benchmark = Callable[[BenchResult, Options], Coroutine[Any, Any, None]]

BENCHMARKS: dict[str, Benchmark] = {
    "send_batch": send.send_batch,
    "send_one": send.send_one,
    "pull": pull.pull,
    "wake_latency": latency.wake_latency,
    "held_pulls": held.held_pulls,
    "replay": replay.replay_benchmark,
    "client_produce": client_produce.client_produce,
    "tls_produce": tls.tls_produce,
    "client_consume": client_consume.client_consume,
    "orderly_consume": orderly_consume.orderly_consume,
    "retry": retry.retry,
    "pop": pop.pop,
    "cluster": cluster.cluster,
    "console_pages": console.console_pages,
    "sql92_eval": sql92.sql92_eval,
    "filtered_wake": sql92.filtered_wake,
    "filtered_pull": filtered_pull.filtered_pull,
    "spark_batch_read": spark.spark_batch_read,
    "spark_stream_latency": spark.spark_stream_latency,
    "spark_cluster_read": spark_cluster.spark_cluster_read,
    "spark_sink_dedup": spark_cluster.spark_sink_dedup,
    "auth_cost": auth.auth_cost,
    "txn_send": txn_send.txn_send,
    "timer": timer.timer,
    "ha_produce": ha.ha_produce,
    "ha_failover": ha_failover.ha_failover,
    "trace_cost": trace.trace_cost,
    "grpc_client": grpc_client.grpc_client,
}


def run_one(name: str, opts: Options) -> BenchResult:
    """Run one benchmark on a fresh uvloop loop; an exception marks it failed, never propagates."""
    result = BenchResult(name=name)
    busy = wait_for_quiet()
    if busy >= 0.3:
        result.notes.append(f"the machine was busy ({busy:.2f} cores used by others) when {name} started")
    started = time.perf_counter()
    try:
        run(BENCHMARKS[name](result, opts))
    except Exception as exc:
        result.ok = False
        result.error = f"{type(exc).__name__}: {exc}"
        result.details["traceback"] = traceback.format_exc()
        print(f"[bench] {name} failed: {result.error}", file=sys.stderr)
    result.elapsed_s = time.perf_counter() - started
    result.params.update(quick=opts.quick, pinned=opts.pinned)
    write_result(result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="reduced sizes (a smoke test, < 60 s)")
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}")
    parser.add_argument("--pin", action="store_true",
                        help="pin the broker to the last CPU and the client to CPU 0 (default: the OS decides)")
    args = parser.parse_args(argv)
    opts = Options.create(quick=args.quick, pin=args.pin)
    opts.pin_client()
    logging.basicConfig(level=logging.WARNING, format="[bench] %(levelname)s %(name)s: %(message)s")
    names = args.only or list(BENCHMARKS)
    results = []
    for name in names:
        print(f"[bench] running {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
        result = run_one(name, opts)
        print(f"[bench] {name} done in {result.elapsed_s:.1f} s", file=sys.stderr, flush=True)
        results.append(result)
    print(format_table(results))
    for result in results:
        for note in result.notes:
            print(f"note: {result.name}: {note}")
    print(cpu_idle_line())
    summary = write_summary(results, opts.quick, opts.pinned)
    print(f"results: {summary.parent}/")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
