"""Where `rocketq admin user ...` and `acl ...` apply: every broker and name server keeps its own
users and ACLs (the AUTH_* codes are the same on both), so a command names its targets.

    -b/--broker ADDR    this broker (repeatable)
    -c/--cluster NAME   every broker of the cluster, masters and slaves, as the name server of
                        --endpoints lists them (GET_BROKER_CLUSTER_INFO)
    --namesrv           the name servers of --endpoints (each one), alone or beside -b / -c
    none of them        the first --endpoints address (a broker, or a name server itself)

A change is sent to each target in turn and each target's outcome is reported: one refusal or
unreachable target does not stop the others (exit 1 when one refused, 2 when one could not be
reached). mqadmin's `-b` / `-c` are the same options."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import click

from admin.base import example_epilog
from admin.common import (
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    CommandError,
    emit,
    endpoints_option,
    json_option,
    parse_endpoints,
    print_json,
    run_admin,
)
from client.admin_api import AdminAPI
from protocol.errors import ConnectionClosed, MQError, RequestTimeout, ResponseError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Target:
    """One server to change: `kind` "broker", "name server" or "endpoint" (--endpoints itself);
    `name` the broker name ("" when not known)."""

    kind: str
    name: str
    address: str

    @property
    def label(self) -> str:
        if self.kind == "broker" and self.name:
            return f"broker {self.name} ({self.address})"
        return f"{self.kind} {self.address}"


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """A target's answer: `value`, or the `error` it answered (or could not be reached with)."""

    target: Target
    value: T | None = None
    error: MQError | None = None


@dataclass(frozen=True, slots=True)
class Selection:
    brokers: tuple[str, ...]
    cluster: str | None
    namesrv: bool


def target_options(command: F) -> F:
    """Decorator: `-b/--broker`, `-c/--cluster` and `--namesrv`, passed as `brokers`, `cluster`, `namesrv`."""
    command = click.option("--namesrv", "namesrv", is_flag=True,
                           help="Also (or, alone, only) the name servers of --endpoints: each keeps its own "
                                "users and ACLs.")(command)
    command = click.option("--cluster", "-c", "cluster", default=None, metavar="NAME",
                           help="Every broker of this cluster (masters and slaves), as the name server of "
                                "--endpoints lists them.")(command)
    return click.option("--broker", "-b", "brokers", multiple=True, metavar="HOST:PORT",
                        help="This broker (repeatable). Without -b, -c or --namesrv: the --endpoints "
                             "address itself.")(command)


async def resolve_targets(api: AdminAPI, endpoints: Sequence[str], selection: Selection) -> list[Target]:
    """The targets of `selection` (see the module docstring), in order: brokers named, the
    cluster's brokers by name then broker id, then the name servers. Raises `CommandError` for an
    unknown cluster or a malformed address, and the name server's error when it cannot list them."""
    targets: list[Target] = []
    for address in selection.brokers:
        try:
            parse_endpoints(address)
        except ValueError as exc:
            raise CommandError(f"--broker: {exc}") from None
        targets.append(Target("broker", "", address))
    if selection.cluster is not None:
        info = await api.get_broker_cluster_info(endpoints[0])
        names = info.cluster_addr_table.get(selection.cluster)
        if not names:
            known = ", ".join(sorted(info.cluster_addr_table)) or "none"
            raise CommandError(f"no broker of cluster {selection.cluster!r} is registered at {endpoints[0]} "
                               f"(clusters: {known})")
        for name in sorted(names):
            data = info.broker_addr_table.get(name)
            for _, address in sorted(data.broker_addrs.items()) if data is not None else ():
                targets.append(Target("broker", name, address))
    if selection.namesrv:
        targets.extend(Target("name server", "", address) for address in endpoints)
    if not targets:
        targets.append(Target("endpoint", "", endpoints[0]))
    unique = {target.address: target for target in reversed(targets)}
    return [target for target in targets if unique[target.address] is target]


def run_on_targets(endpoints: str, selection: Selection,
                   work: Callable[[AdminAPI, str], Awaitable[T]]) -> list[Outcome[T]]:
    """`work(api, address)` on each target; a target's `MQError` is its outcome, not the end of the
    command. Resolving the targets fails as any admin command does (one line, exit 1 or 2)."""
    addresses = parse_endpoints(endpoints)

    async def each(api: AdminAPI, _: str) -> list[Outcome[T]]:
        outcomes: list[Outcome[T]] = []
        for target in await resolve_targets(api, addresses, selection):
            try:
                outcomes.append(Outcome(target, value=await work(api, target.address)))
            except MQError as exc:
                outcomes.append(Outcome(target, error=exc))
        return outcomes
    return run_admin(endpoints, each)


def error_text(error: MQError) -> str:
    if isinstance(error, ResponseError):
        return f"refused: {error.code.name}: {error.remark}"
    return f"cannot be reached: {error}"


def exit_code(outcomes: Sequence[Outcome[Any]]) -> int:
    """0 when every target answered, 2 when one could not be reached, else 1 when one refused."""
    errors = [o.error for o in outcomes if o.error is not None]
    if any(isinstance(e, ConnectionClosed | RequestTimeout) for e in errors):
        return EXIT_UNREACHABLE
    return EXIT_REFUSED if errors else 0


def report_changes(outcomes: Sequence[Outcome[None]], done: str, as_json: bool) -> None:
    """One line per target (`done` on success, e.g. "created user billing"), or a JSON array of
    `{target, address, ok, error}`; then exits with `exit_code`."""
    if as_json:
        print_json([{"target": o.target.label, "address": o.target.address, "ok": o.error is None,
                     **({"error": error_text(o.error)} if o.error is not None else {})} for o in outcomes])
    else:
        for outcome in outcomes:
            if outcome.error is None:
                click.echo(f"{done} on {outcome.target.label}")
            else:
                click.echo(f"{outcome.target.label}: {error_text(outcome.error)}", err=True)
    code = exit_code(outcomes)
    if code:
        raise SystemExit(code)


def report_failures(outcomes: Sequence[Outcome[Any]]) -> None:
    """For reads: each failed target's line on stderr (so a JSON stdout stays parseable)."""
    for outcome in outcomes:
        if outcome.error is not None:
            click.echo(f"{outcome.target.label}: {error_text(outcome.error)}", err=True)


def show_rows(outcomes: Sequence[Outcome[Any]], rows: list[dict[str, Any]], columns: list[str], as_json: bool,
              title: str) -> None:
    """For reads: `rows` (each with an "at" key naming its target) as a table or JSON, the "at"
    column kept only when there is more than one target; failed targets on stderr; then exits 1
    or 2 when a target failed (`exit_code`)."""
    if len(outcomes) > 1:
        columns = ["at", *columns]
    else:
        for row in rows:
            row.pop("at", None)
    emit(rows, as_json, title=title, columns=columns)
    report_failures(outcomes)
    if exit_code(outcomes):
        raise SystemExit(exit_code(outcomes))


def target_command(command: F) -> F:
    """`target_options`, `--endpoints` (with the connection options) and `--json`: what every user
    and ACL command takes, in that order of parameters."""
    return target_options(endpoints_option(json_option(command)))


async def as_list(value: Awaitable[T]) -> list[T]:
    """`[await value]`: a get's one answer shaped as a list's, so both print alike."""
    return [await value]


def get_command(group: click.Group, example: str, key_option: Callable[[Any], Any], doc: str,
                fetch: Callable[[AdminAPI, str, str], Awaitable[T]],
                show: Callable[[list[Outcome[list[T]]], bool, str], None], title: str) -> None:
    """Add `get` to `group` (`user get`, `acl get`): `key_option`'s value (the user name, the
    subject) fetched from each target with `fetch(api, address, key)` and printed by `show` under
    `title` ("user {}": the key goes in the braces); `doc` is its help, `example` its example."""
    @group.command("get", help=doc, epilog=example_epilog(example))
    @key_option
    @target_command
    def get(brokers: tuple[str, ...], cluster: str | None, namesrv: bool, endpoints: str, as_json: bool,
            **key_value: str) -> None:
        [key] = key_value.values()
        outcomes = run_on_targets(endpoints, Selection(brokers, cluster, namesrv),
                                  lambda api, address: as_list(fetch(api, address, key)))
        show(outcomes, as_json, title.format(key))
