"""Command line: `rocketq broker start`, and `mqbroker` / `python -m broker` for the same thing.

Config resolution is the pure `resolve_config`; running is `serve` under `asyncio.Runner`."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click

from broker.host import warn_if_idle_halts
from broker.store.check import check_store
from broker.store.lock import StoreLocked
from conf import BrokerConfig, ConfigError, load
from conf.broker import EventLoop
from conf.client import CLIENT_ENV
from conf.namesrv import ENV_PREFIX as NAMESRV_ENV_PREFIX
from conf.namesrv import parse_namesrv_addr

log = logging.getLogger(__name__)

DEFAULT_CONFIG_PATH = Path("conf/broker.toml")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class BrokerLike(Protocol):
    """What `serve` needs of `broker.broker.Broker`."""

    async def start(self) -> None: ...  # returns when listening; OSError if the address is taken
    async def stop(self) -> None: ...  # graceful, bounded by graceful_shutdown_timeout_ms

    @property
    def address(self) -> str: ...


BrokerFactory = Callable[[BrokerConfig], BrokerLike]


# --- config --------------------------------------------------------------------------------------


def parse_sets(sets: Sequence[str]) -> dict[str, str]:
    """`["long_polling.enable=false", ...]` → `{"long_polling.enable": "false"}`; a later key wins.
    The value is everything after the first `=` (it may be empty). Raises `ConfigError` without `=`."""
    parsed: dict[str, str] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. long_polling.enable=false")
        parsed[key.strip()] = value
    return parsed


def resolve_config(
    config_path: Path | None,
    listen_host: str | None,
    listen_port: int | None,
    store_dir: Path | None,
    sets: Sequence[str],
    env: Mapping[str, str],
    namesrv_addr: str | None = None,
) -> BrokerConfig:
    """The broker's config from, lowest first: defaults < `config_path` (or `conf/broker.toml` in the
    working directory when None and it exists) < `env` (`ROCKETQ_*`) < `sets` (`KEY=VALUE`) <
    `listen_host` / `listen_port` / `store_dir` / `namesrv_addr` (None: not given). The name
    server's `ROCKETQ_NAMESRV__*` variables and the command-line clients' (`ROCKETQ_ENDPOINTS`,
    `ROCKETQ_ACCESS_KEY`, `ROCKETQ_TLS`, ...: `conf.client.CLIENT_ENV`) are not the broker's and are
    skipped. Raises `ConfigError`."""
    if config_path is None and DEFAULT_CONFIG_PATH.is_file():
        config_path = DEFAULT_CONFIG_PATH
    client_env = set(CLIENT_ENV.values())
    env = {k: v for k, v in env.items() if not k.startswith(NAMESRV_ENV_PREFIX) and k not in client_env}
    config = load(BrokerConfig, file=config_path, env=env, overrides=parse_sets(sets))
    if namesrv_addr is not None:
        config = replace(config, namesrv_addr=namesrv_addr)
    try:
        parse_namesrv_addr(config.namesrv_addr)
    except ValueError as err:
        raise ConfigError(str(err), key="namesrv_addr") from None
    if listen_host is not None:
        config = replace(config, listen_host=listen_host)
    if listen_port is not None:
        config = replace(config, listen_port=listen_port)
    if store_dir is not None:
        config = replace(config, store=replace(config.store, path=store_dir))
    return config


def event_loop_factory(event_loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop]:
    """The `loop_factory` for `asyncio.Runner`: "auto" is uvloop when importable, else asyncio.
    Raises `ConfigError` for "uvloop" when uvloop is not installed."""
    if event_loop == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if event_loop == "uvloop":
            raise ConfigError("event_loop = 'uvloop' but uvloop is not installed; "
                              "install it or use --set event_loop=asyncio", key="event_loop") from None
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


# --- running -------------------------------------------------------------------------------------


class ShutdownSignals:
    """The first SIGTERM or SIGINT calls `request_stop` once; a second SIGINT calls `force_exit(1)`
    (a stop that hangs can be cut short with Ctrl-C twice); later SIGTERMs are only logged."""

    def __init__(self, request_stop: Callable[[], None], force_exit: Callable[[int], None]) -> None:
        self._request_stop, self._force_exit = request_stop, force_exit
        self._stopping = False

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self._stopping:
            self._stopping = True
            log.info("received %s, stopping gracefully (press Ctrl-C again to force)", name)
            self._request_stop()
        elif signum == signal.SIGINT:
            log.error("received %s again, forcing exit without a graceful stop", name)
            self._force_exit(1)
        else:
            log.info("received %s, already stopping", name)


def _force_exit(code: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def describe_start_failure(config: BrokerConfig | Any, err: OSError, what: str = "broker") -> str:
    """One line for an `OSError` from `start()` of a broker (or, with `what`, a name server);
    `config` has `listen_host` and `listen_port`. A `StoreLocked` says which process holds the store."""
    if err.filename in ("metrics_port", "grpc_port"):
        return str(err.strerror)
    if isinstance(err, StoreLocked):
        return str(err)
    where = f"{config.listen_host}:{config.listen_port}"
    if err.errno == errno.EADDRINUSE:
        return (f"cannot listen on {where}: address already in use "
                f"(another {what} running? pick another --listen-port)")
    if err.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: {config.listen_host} is not an address of this machine"
    return f"{what} failed to start on {where}: {err.strerror or err}"


async def serve_until_signalled(daemon: BrokerLike, describe_failure: Callable[[OSError], str],
                                describe_started: Callable[[], str], name: str, stop_timeout_ms: int,
                                force_exit: Callable[[int], None] = _force_exit) -> int:
    """Start `daemon` (a broker or a name server) and run it until SIGTERM or SIGINT, then stop it
    gracefully.

    Returns the exit code: 0 after a graceful stop; 1 when `start()` raises `OSError` (reported as
    one line on stderr by `describe_failure`). Signal handlers are installed before `start()`, so a
    signal during recovery stops it as soon as it is up; a second SIGINT calls `force_exit(1)`
    (default: log and `os._exit(1)`). Handlers are removed before returning. Main thread only."""
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    signals = ShutdownSignals(stop_requested.set, force_exit)
    handled = (signal.SIGTERM, signal.SIGINT)
    for signum in handled:
        loop.add_signal_handler(signum, signals.on_signal, signum)
    try:
        try:
            await daemon.start()
        except OSError as err:
            click.echo(f"rocketq: {describe_failure(err)}", err=True)
            return 1
        log.info("%s", describe_started())
        await stop_requested.wait()
        log.info("stopping %s (up to %d ms)", name, stop_timeout_ms)
        await daemon.stop()
        log.info("%s stopped", name)
        return 0
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


async def serve(config: BrokerConfig, broker_factory: BrokerFactory,
                force_exit: Callable[[int], None] = _force_exit) -> int:
    """Start a broker and run it until SIGTERM or SIGINT, then stop it gracefully (see
    `serve_until_signalled`); logs `listening on HOST:PORT` once it accepts connections."""
    broker = broker_factory(config)
    return await serve_until_signalled(
        broker, lambda err: describe_start_failure(config, err),
        lambda: (f"rocketq broker {config.broker_name} listening on {broker.address} "
                 f"(store {config.store.path}, flush {config.store.flush_disk_type})"),
        f"broker {config.broker_name}", config.graceful_shutdown_timeout_ms, force_exit)


def tune_garbage_collector() -> None:
    """For a long-running daemon: move everything imported so far (click, prometheus_client, lark,
    msgpack, the broker's modules: ~100k objects) out of the collector's sight with `gc.freeze()`,
    so the oldest generation's rounds no longer walk them. Measured on one-at-a-time sends: broker
    user CPU 24 → 21 µs per send (perf showed the collector at ~4 % of the broker's CPU). A larger
    young-generation threshold (50,000 instead of 700) measured the same, so it is left alone."""
    import gc
    gc.freeze()


def tune_thread_switching() -> None:
    """A Python thread that wants the GIL waits up to the switch interval (5 ms by default) while
    another runs Python; a send that crosses the loop's GIL several times while a /metrics render
    (2.3 MB, ~250 ms in its thread) holds it waited 17-42 ms. With 1 ms: 8-12 ms
    (tests/broker/test_metrics_bounds.py's probe, p99 and max of 70-300 sends, 3 runs each). The
    broker's other threads run C that releases the GIL (fsync, disk writes) or brief jobs: single
    sends (`python -m bench --only send_one`) 22,174 / 41,386 msg/s SYNC / ASYNC_FLUSH after, 20,080
    / 38,719 before, the same hour (this machine's noise is ±10 %)."""
    sys.setswitchinterval(0.001)


def run_broker(config: BrokerConfig, loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> int:
    """Configure logging, import the broker (lazily, so `--help` never needs it) and `serve` it."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    from broker.broker import Broker  # type: ignore[import-not-found, unused-ignore]

    factory: BrokerFactory = Broker
    tune_garbage_collector()
    tune_thread_switching()
    warn_if_idle_halts()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve(config, factory))


# --- commands ------------------------------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])

_PRECEDENCE = (
    "Settings are taken, lowest first, from built-in defaults, the config file, ROCKETQ_* environment "
    "variables (ROCKETQ_LISTEN_PORT=10912, ROCKETQ_LONG_POLLING__ENABLE=false), --set, and finally "
    "--listen-host, --listen-port and --store-dir. Unknown keys are an error. Stop with SIGTERM or "
    "Ctrl-C (graceful); Ctrl-C twice forces an immediate exit with code 1."
)
# Every command's help ends with one example (tests/test_cli_help.py): click prints a `\b` paragraph as written.
_START_EXAMPLE = "\b\nExample:\n  rocketq broker start --config conf/broker.toml --store-dir ./store"
_MQBROKER_EXAMPLE = "\b\nExample:\n  mqbroker --namesrv-addr 127.0.0.1:9876 --set broker_name=broker-b"
_STORE_CHECK_EXAMPLE = "\b\nExample:\n  rocketq store check --store-dir ./store"


def _start_options(command: _F) -> _F:
    defaults = BrokerConfig()
    options = [
        click.option(
            "--config", "config_path", metavar="PATH",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help=f"TOML config file (every key with comments: conf/broker.toml). "
                 f"[default: {DEFAULT_CONFIG_PATH} if it exists in the working directory, "
                 f"else built-in defaults]"),
        click.option(
            "--listen-host", metavar="HOST",
            help=f"Address to accept client connections on; 0.0.0.0 for all interfaces. Overrides "
                 f"listen_host. [default: from the config, {defaults.listen_host}]"),
        click.option(
            "--listen-port", metavar="PORT", type=click.IntRange(0, 65535),
            help=f"TCP port to listen on; 0 picks a free one (the log shows which). Overrides "
                 f"listen_port. [default: from the config, {defaults.listen_port}]"),
        click.option(
            "--store-dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
            help=f"Directory for the commit log, consume queues and broker state (offsets, topics, "
                 f"groups); created if missing, relative to the working directory; one broker at a "
                 f"time (locked by DIR/lock). Overrides store.path. [default: from the config, "
                 f"{defaults.store.path}]"),
        click.option(
            "--namesrv-addr", metavar="HOST:PORT[;HOST:PORT]",
            help="Name servers to register with (every 30 s and on every topic change), so clients "
                 "find this broker through them. Overrides namesrv_addr. [default: from the config, "
                 "none: a lone broker]"),
        click.option(
            "--set", "sets", metavar="KEY=VALUE", multiple=True,
            help="Set any config key by its dotted name, e.g. --set long_polling.enable=false or "
                 "--set store.flush_disk_type=ASYNC_FLUSH. Repeatable; overrides the environment "
                 "and the config file."),
        insecure_option("clients", "a broker"),
    ]
    return with_options(command, options)


def insecure_option(peers: str, server: str) -> Callable[[_F], _F]:
    """`--insecure`: protected_mode = false (shared by `broker start` and `namesrv start`)."""
    return click.option(
        "--insecure", is_flag=True,
        help=f"Serve {peers} from any address with authentication off (protected_mode = false). Without it, "
             f"{server} listening beyond loopback with authentication off refuses non-loopback peers "
             f"(protected mode).")


def with_options(command: _F, options: Sequence[Callable[[_F], _F]]) -> _F:
    """`command` with click `options` applied, the first listed first in --help."""
    for option in reversed(options):
        command = option(command)
    return command


def _start(config_path: Path | None, listen_host: str | None, listen_port: int | None,
           store_dir: Path | None, namesrv_addr: str | None, sets: tuple[str, ...], insecure: bool) -> None:
    try:
        config = resolve_config(config_path, listen_host, listen_port, store_dir, sets, os.environ, namesrv_addr)
        if insecure:
            config = replace(config, protected_mode=False)
        loop_factory = event_loop_factory(config.event_loop)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    click.get_current_context().exit(run_broker(config, loop_factory))


@click.group(context_settings=_CONTEXT_SETTINGS)
def main() -> None:
    """rocketq: a RocketMQ-style message broker."""


@main.group("broker")
def broker_group() -> None:
    """Run a broker."""


@broker_group.command("start", epilog=f"{_PRECEDENCE}\n\n{_START_EXAMPLE}")
@_start_options
def start(config_path: Path | None, listen_host: str | None, listen_port: int | None,
          store_dir: Path | None, namesrv_addr: str | None, sets: tuple[str, ...], insecure: bool) -> None:
    """Start a broker in the foreground and serve until stopped."""
    _start(config_path, listen_host, listen_port, store_dir, namesrv_addr, sets, insecure)


@click.command("mqbroker", context_settings=_CONTEXT_SETTINGS, epilog=f"{_PRECEDENCE}\n\n{_MQBROKER_EXAMPLE}")
@_start_options
def mqbroker(config_path: Path | None, listen_host: str | None, listen_port: int | None,
             store_dir: Path | None, namesrv_addr: str | None, sets: tuple[str, ...], insecure: bool) -> None:
    """Start a broker in the foreground (same as `rocketq broker start`)."""
    _start(config_path, listen_host, listen_port, store_dir, namesrv_addr, sets, insecure)


@main.group("store")
def store_group() -> None:
    """Inspect a broker's store on disk."""


@store_group.command("check", epilog=_STORE_CHECK_EXAMPLE)
@click.option("--store-dir", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True,
              help="The store directory (the broker's store.path); the broker should be stopped.")
def store_check(store_dir: Path) -> None:
    """Check that every consume-queue unit points at an intact commit-log record (size, CRC, and the
    record's topic, queue id and offsets). Exits 1 when a problem is found."""
    report = check_store(store_dir)
    for problem in report.problems:
        click.echo(f"problem: {problem}")
    if report.problem_count > len(report.problems):
        click.echo(f"... and {report.problem_count - len(report.problems)} more problems")
    click.echo(f"store {store_dir}: {report.queues} consume queues, {report.units} units checked, "
               f"{report.below_commit_log} below the commit log's start (retention), "
               f"{report.problem_count} problems: {'consistent' if report.ok else 'INCONSISTENT'}")
    click.get_current_context().exit(0 if report.ok else 1)
