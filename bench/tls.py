"""`tls_produce`: what TLS costs a `Producer`, against one broker process in `tls.mode = "permissive"`,
so the TLS and the plaintext producer talk to the same broker on the same port.

- `tls_produce.send.128B.<plain|tls>`: one message per `Producer.send`, `one_workers` tasks at once;
- `tls_produce.send_batch.128B.<plain|tls>`: `Producer.send_batch` of 32, `batch_workers` tasks;
- `tls_produce.<kind>.128B.tls_vs_plain`: the TLS rate over the plaintext one (1.0: free);
- `....<client|broker>_us_per_msg`: CPU per message of each side, in µs (steadier than the rates on
  a machine shared with other work).

ASYNC_FLUSH, so the numbers are the transport's and not the fsync's. The certificates are made
fresh by `conf.devcerts` (the `cryptography` package of the dev extra) in a temporary directory.
As `client_produce`, every run has its own topic and the broker's max offsets must add up to the
messages acknowledged."""

from __future__ import annotations

import ssl
import tempfile
from dataclasses import asdict
from pathlib import Path

from bench.client_produce import (
    ProduceParams,
    batch_sender,
    create_topic,
    latency_summary,
    max_offsets,
    one_sender,
    stats_json,
)
from bench.common import BATCH_SIZE, PRODUCER_GROUP, CpuMeter, Options, drive, note_neighbours, running_broker
from bench.report import BenchResult
from client import Producer
from conf.devcerts import make_certs
from conf.tls import client_context

SEND_TIMEOUT_MS = 10_000


TlsParams = ProduceParams     # the same shape as client_produce's rows, other sizes


FULL = TlsParams(one_messages=60_000, one_workers=64, batch_messages=320_000, batch_workers=32,
                 time_limit_s=8.0, queues=8, body_bytes=128)
QUICK = TlsParams(one_messages=5_000, one_workers=64, batch_messages=32_000, batch_workers=32,
                  time_limit_s=2.0, queues=8, body_bytes=128)


async def _run(result: BenchResult, broker_address: str, meter: CpuMeter, kind: str, transport: str,
               ssl_context: ssl.SSLContext | None, params: TlsParams) -> float:
    """One measured run; returns its rate in msg/s (and fails `result` on a lost or failed send)."""
    topic = f"bench_tls_{kind}_{transport}"
    await create_topic(broker_address, topic, params.queues)
    batched, latencies = kind == "send_batch", list[float]()
    async with Producer(PRODUCER_GROUP, broker_address, send_msg_timeout_ms=SEND_TIMEOUT_MS,
                        ssl_context=ssl_context) as producer:
        call = (batch_sender if batched else one_sender)(producer, topic, bytes(params.body_bytes), latencies)
        warm = await drive(range(params.queues * 4), call, workers=params.queues, time_limit_s=10)
        latencies.clear()
        count = params.batch_messages // BATCH_SIZE if batched else params.one_messages
        workers = params.batch_workers if batched else params.one_workers
        meter.start()
        stats = await drive(range(count), call, workers=workers, time_limit_s=params.time_limit_s)
        cpu = meter.stop()
    label = f"tls_produce.{kind}.{params.body_bytes}B.{transport}"
    result.add(label, round(stats.rate), "msg/s")
    result.add(f"{label}.client_cpu", cpu["client_cores"], "cores")
    result.add(f"{label}.broker_cpu", cpu["broker_cores"], "cores")
    for side in ("client", "broker"):       # CPU per message: what TLS costs, whatever the neighbours took
        result.add(f"{label}.{side}_us_per_msg", round(cpu[f"{side}_cores"] * 1e6 / stats.rate, 2), "µs")
    acknowledged = warm.messages + stats.messages
    stored = sum(await max_offsets(broker_address, topic, params.queues))
    result.details[label] = {**stats_json(stats), **cpu, **latency_summary(latencies), "workers": workers,
                             "acknowledged_with_warmup": acknowledged, "broker_max_offsets_sum": stored}
    note_neighbours(result, label, cpu)
    if warm.errors or stats.errors or stored != acknowledged:
        result.ok = False
        result.error = (f"{label}: {warm.errors + stats.errors} failed sends ({stats.error_samples[:1]}), "
                        f"broker holds {stored} of {acknowledged} acknowledged")
    return stats.rate


async def tls_produce(result: BenchResult, opts: Options) -> None:
    params = QUICK if opts.quick else FULL
    result.params = {**asdict(params), "batch_size": BATCH_SIZE, "flush": "ASYNC_FLUSH", "tls_mode": "permissive"}
    result.notes.append("one broker in permissive mode serves both; one Producer (one connection) per run")
    with tempfile.TemporaryDirectory(prefix="rocketq-bench-tls-") as directory:
        certs = make_certs(Path(directory))
        settings = {"store.flush_disk_type": "ASYNC_FLUSH", "tls.mode": "permissive",
                    "tls.cert_file": certs.server_cert, "tls.key_file": certs.server_key}
        async with running_broker(opts, settings) as broker:
            meter = CpuMeter(broker)
            for kind in ("send", "send_batch"):
                rates = {transport: await _run(result, broker.address, meter, kind, transport, context, params)
                         for transport, context in (("plain", None), ("tls", client_context(certs.ca_file)))}
                result.add(f"tls_produce.{kind}.{params.body_bytes}B.tls_vs_plain",
                           round(rates["tls"] / rates["plain"], 3), "x")
