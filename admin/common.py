"""What every admin command shares: the `--endpoints` (`-n`, $ROCKETQ_ENDPOINTS) / `--json` options,
how it connects (`--access-key`, $ROCKETQ_ACCESS_KEY; `--secret-key`, $ROCKETQ_SECRET_KEY; `--tls`,
$ROCKETQ_TLS; `--ca-file`, $ROCKETQ_CA_FILE; `--cert-file`, $ROCKETQ_CERT_FILE and `--key-file`,
$ROCKETQ_KEY_FILE, the client certificate of mutual TLS: `connection_options`, which `endpoints_option` adds, so
every command and `rocketq top` has them), one client API per command run, clear one-line errors
(exit code 2 when no broker can be reached or the endpoints are malformed, 1 when a broker refuses
the request), and table or JSON output.

    @admin_group.command("example", epilog=example_epilog("rocketq admin example --json"))
    @command_options
    def example(endpoints: str, as_json: bool) -> None:
        rows = run_admin(endpoints, lambda api, address: fetch(api, address))
        emit(rows, as_json, title="Example", columns=["a", "b"])
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient
from conf.client import CLIENT_ENV
from conf.tls import client_context
from protocol.errors import ConnectionClosed, MQError, RequestTimeout, ResponseError
from protocol.signing import Credentials

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_ENDPOINTS = "127.0.0.1:10911"
ENDPOINTS_ENV, ACCESS_KEY_ENV, SECRET_KEY_ENV = (CLIENT_ENV["endpoints"], CLIENT_ENV["access_key"],
                                                  CLIENT_ENV["secret_key"])
TLS_ENV, CA_FILE_ENV = CLIENT_ENV["tls"], CLIENT_ENV["ca_file"]
CERT_FILE_ENV, KEY_FILE_ENV = CLIENT_ENV["cert_file"], CLIENT_ENV["key_file"]
EXIT_USAGE = 2
EXIT_UNREACHABLE = 2
EXIT_REFUSED = 1


def endpoints_option(command: F) -> F:
    """`--endpoints/-n HOST:PORT[;...]`, resolved by `resolve_endpoints`, and `connection_options`."""
    return click.option(
        "--endpoints", "-n", "endpoints", default=DEFAULT_ENDPOINTS, show_default=True, envvar=ENDPOINTS_ENV,
        show_envvar=True, metavar="HOST:PORT[;...]", callback=resolve_endpoints,
        help="Broker or name server address(es); the first is used. Also before the subcommand "
             "(rocketq admin -n 127.0.0.1:9876 topic list).")(connection_options(command))


# -- how to connect: the shared options that are not the command's own arguments ------------------


@dataclass(frozen=True, slots=True)
class Connection:
    """How a command connects, from `connection_options` (before or after the subcommand, or the
    environment). Add a shared connection setting here, in `connection_options` and in
    `remoting_client`; commands get it through `run_admin` / `current_connection` unchanged."""

    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    tls: bool = False
    ca_file: str = ""       # implies tls
    cert_file: str = ""     # the client certificate (mutual TLS; implies tls)
    key_file: str = ""      # its private key ("": in cert_file)

    @property
    def credentials(self) -> Credentials | None:
        """The user every request is signed as; None without one (`current_connection` has
        checked that both or neither are given)."""
        return Credentials(self.access_key, self.secret_key) if self.access_key else None

    def remoting_client(self, *, connect_timeout_ms: int = 3_000) -> RemotingClient:
        """Connections as these settings say: every request signed with `credentials`, over TLS
        when `tls`, `ca_file` or `cert_file`, presenting `cert_file` / `key_file` when a server asks
        for a client certificate; raises `TlsError` (an `OSError`) for an unreadable CA file,
        certificate or key."""
        tls = self.tls or bool(self.ca_file) or bool(self.cert_file)
        context = client_context(self.ca_file, self.cert_file, self.key_file) if tls else None
        return RemotingClient(connect_timeout_ms=connect_timeout_ms, credentials=self.credentials,
                              ssl_context=context)


_CONNECTION_META = "rocketq.connection"    # click's ctx.meta is shared by a command and its groups


def connection_options(command: F) -> F:
    """`--access-key USER` ($ROCKETQ_ACCESS_KEY), `--secret-key PASSWORD` ($ROCKETQ_SECRET_KEY),
    `--tls` ($ROCKETQ_TLS=1), `--ca-file PATH` ($ROCKETQ_CA_FILE), `--cert-file PATH`
    ($ROCKETQ_CERT_FILE) and `--key-file PATH` ($ROCKETQ_KEY_FILE), recorded for
    `current_connection()` instead of passed to the command."""
    options = [
        click.option("--access-key", metavar="USER", default=None, envvar=ACCESS_KEY_ENV, show_envvar=True,
                     expose_value=False, callback=_remember_connection,
                     help="Sign every request as this user (brokers and name servers with authentication on)."),
        click.option("--secret-key", metavar="PASSWORD", default=None, envvar=SECRET_KEY_ENV, show_envvar=True,
                     expose_value=False, callback=_remember_connection,
                     help=f"The user's password; prefer ${SECRET_KEY_ENV} (a command line is visible to the "
                          "host's other users)."),
        click.option("--tls", is_flag=True, envvar=TLS_ENV, show_envvar=True, expose_value=False,
                     callback=_remember_connection,
                     help="Connect over TLS, verifying the servers' certificates (the system's CAs "
                          "unless --ca-file)."),
        click.option("--ca-file", "ca_file", metavar="PATH", default=None, envvar=CA_FILE_ENV, show_envvar=True,
                     type=click.Path(exists=True, dir_okay=False), expose_value=False,
                     callback=_remember_connection,
                     help="PEM CA certificates the servers' certificates must chain to; implies --tls."),
        click.option("--cert-file", "cert_file", metavar="PATH", default=None, envvar=CERT_FILE_ENV,
                     show_envvar=True, type=click.Path(exists=True, dir_okay=False), expose_value=False,
                     callback=_remember_connection,
                     help="PEM client certificate (and its key, unless --key-file) presented to servers that "
                          "require one (tls.require_client_cert); implies --tls."),
        click.option("--key-file", "key_file", metavar="PATH", default=None, envvar=KEY_FILE_ENV, show_envvar=True,
                     type=click.Path(exists=True, dir_okay=False), expose_value=False,
                     callback=_remember_connection, help="PEM private key of --cert-file."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _remember_connection(ctx: click.Context, param: click.Parameter, value: object) -> None:
    """Keep `value` for `current_connection`; a subcommand's default or environment value does not
    undo one given on the command line before it (`rocketq admin --access-key admin topic list`)."""
    settings: dict[str, object] = ctx.meta.setdefault(_CONNECTION_META, {})
    name = param.name or ""
    if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE or name not in settings:
        settings[name] = value


def current_connection() -> Connection:
    """The connection settings of the running click command (defaults outside one). An access key
    without a secret key, or the reverse, is a usage error: one line, exit code 2."""
    ctx = click.get_current_context(silent=True)
    settings = ctx.meta.get(_CONNECTION_META, {}) if ctx is not None else {}
    access_key, secret_key = str(settings.get("access_key") or ""), str(settings.get("secret_key") or "")
    if bool(access_key) != bool(secret_key):
        fail(f"give --access-key and --secret-key together (or ${ACCESS_KEY_ENV} and ${SECRET_KEY_ENV})",
             EXIT_USAGE)
    cert_file, key_file = str(settings.get("cert_file") or ""), str(settings.get("key_file") or "")
    if key_file and not cert_file:
        fail(f"--key-file needs --cert-file (or ${CERT_FILE_ENV})", EXIT_USAGE)
    return Connection(access_key=access_key, secret_key=secret_key, tls=bool(settings.get("tls", False)),
                      ca_file=str(settings.get("ca_file") or ""), cert_file=cert_file, key_file=key_file)


def resolve_endpoints(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """The endpoints a command talks to: its own --endpoints/-n, else one given before the
    subcommand (`rocketq admin -n H:P topic list`), else $ROCKETQ_ENDPOINTS, else the default. A
    malformed value is one line and exit 2 (a group leaves the variable to its subcommand)."""
    name = param.name or "endpoints"
    given = ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    outer = ctx.parent
    while not given and outer is not None:
        if outer.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            return str(outer.params[name])              # checked when it was parsed
        outer = outer.parent
    if not given and isinstance(ctx.command, click.Group):
        return value
    try:
        parse_endpoints(value)
    except ValueError as exc:
        source = "--endpoints" if given or ctx.get_parameter_source(name) is not ParameterSource.ENVIRONMENT \
            else ENDPOINTS_ENV
        fail(f"{source}: {exc}", EXIT_USAGE)
    return value


def parse_endpoints(endpoints: str) -> list[str]:
    """`"host:port;host:port"` (`;` or `,` separated, blanks dropped) as a list; raises
    `ValueError` naming the first entry that is not HOST:PORT with a port in 1..65535, or when
    there is none."""
    items = [item.strip() for item in endpoints.replace(",", ";").split(";") if item.strip()]
    if not items:
        raise ValueError(f"{endpoints!r} names no HOST:PORT (e.g. 127.0.0.1:10911)")
    for item in items:
        host, sep, port = item.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{item!r} is not HOST:PORT with a port in 1..65535 (e.g. 127.0.0.1:10911)")
    return items


def json_option(command: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON (for scripts) instead of a table.")(command)


def command_options(command: F) -> F:
    """The options every admin command takes, `--endpoints/-n` then `--json` (`endpoints_option`,
    `json_option`): the command gets `endpoints: str` and `as_json: bool`."""
    return endpoints_option(json_option(command))


def first_endpoint(endpoints: str) -> str:
    """The first of `"host:port;host:port"`; a usage error when there is none."""
    try:
        return parse_endpoints(endpoints)[0]
    except ValueError as exc:
        raise click.UsageError(f"--endpoints: {exc}") from None


class CommandError(Exception):
    """A command cannot do what was asked (e.g. the message does not exist): one line, exit 1."""


def fail(message: str, exit_code: int) -> NoReturn:
    click.echo(f"rocketq admin: {message}", err=True)
    sys.exit(exit_code)


def emit(rows: Sequence[dict[str, Any]], as_json: bool, *, title: str, columns: Sequence[str],
         empty: str = "(none)", footer: str | None = None) -> None:
    """`rows` as one `table` with `columns` (keys of each row) or, with `as_json`, as a JSON array."""
    if as_json:
        print_json(list(rows))
        return
    if not rows:
        click.echo(f"{title}: {empty}")
        return
    print_tables(table(title, columns, [[row.get(column, "") for column in columns] for row in rows]))
    if footer:
        click.echo(footer)


# -- shared by topic, group, consumer, offset, message, broker status and top ---------------------


def run_admin(endpoints: str, work: Callable[[AdminAPI, str], Awaitable[T]], timeout_s: float | None = 60.0) -> T:
    """`run` for commands that need the admin requests: `work(admin_api, address)` with the first
    endpoint's address; the same one-line errors and exit codes (2 unreachable, 1 refused), the
    unreachable line naming the address that failed (a broker behind a name server, too).
    Connects as `current_connection()` says (credentials, TLS)."""
    address = first_endpoint(endpoints)
    connection = current_connection()

    async def main() -> T:
        remoting = connection.remoting_client()
        try:
            async with asyncio.timeout(timeout_s):
                return await work(AdminAPI(remoting), address)
        finally:
            await remoting.close()
    try:
        return asyncio.run(main())
    except (ConnectionClosed, RequestTimeout, ConnectionError, TimeoutError, OSError) as exc:
        unreachable = exc.address if isinstance(exc, ConnectionClosed | RequestTimeout) else address
        reason = str(exc).removeprefix(f"{unreachable}: ") or type(exc).__name__
        fail(f"cannot reach the broker at {unreachable}: {reason}", EXIT_UNREACHABLE)
    except ResponseError as exc:
        fail(f"the broker at {address} refused: {exc.code.name}: {exc.remark}", EXIT_REFUSED)
    except (CommandError, MQError) as exc:
        fail(str(exc), EXIT_REFUSED)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def show(as_json: bool, value: Any, *tables: Table) -> None:
    """A command's answer: `value` as JSON with `as_json` (`print_json`), else `tables` (`print_tables`)."""
    if as_json:
        print_json(value)
    else:
        print_tables(*tables)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A rich table. Numeric columns are right-aligned and never wrapped; identifier columns (every
    value one word: ids, names, addresses) are never wrapped and get their full width first; other
    text columns fold when the width is short. Printed by `print_tables`, a non-terminal never
    folds anything; a terminal too narrow even for the identifiers folds them as a last resort."""
    result = Table(title=title, title_justify="left", show_lines=False)
    for index, name in enumerate(columns):
        cells = [row[index] for row in rows]
        numeric = bool(cells) and all(isinstance(cell, int | float) for cell in cells)
        identifier = bool(cells) and not numeric and all(len(str(cell).split()) <= 1 for cell in cells)
        widest = max((len(str(cell)) for cell in cells), default=0)
        result.add_column(name, justify="right" if numeric else "left", no_wrap=numeric or identifier,
                          overflow="fold", min_width=widest if identifier else None)
    for row in rows:
        result.add_row(*("" if cell is None else str(cell) for cell in row))
    return result


MIN_TABLE_WIDTH = 160


def print_tables(*tables: Table) -> None:
    """Print `tables` at the terminal's width (at least `MIN_TABLE_WIDTH`; a terminal wraps longer
    lines itself); to a pipe or a file, at the widest table's natural width, so no cell folds."""
    console = Console()
    width = max(MIN_TABLE_WIDTH, console.width)
    if not console.is_terminal:
        natural = Console(width=1 << 20)
        width = max([width, *(natural.measure(item).maximum for item in tables)])
    console = Console(width=width)
    for item in tables:
        console.print(item)


def format_time_ms(epoch_ms: int) -> str:
    """Local time "YYYY-MM-DD HH:MM:SS.mmm"; "-" for 0 or less."""
    if epoch_ms <= 0:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def format_duration_ms(duration_ms: int) -> str:
    """"1h02m03s", "4.2s", "0"."""
    if duration_ms <= 0:
        return "0"
    seconds = duration_ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def format_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
