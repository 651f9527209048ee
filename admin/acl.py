"""`rocketq admin acl create|update|delete|get|list` (mqadmin `createAcl`, `updateAcl`, `deleteAcl`,
`getAcl`, `listAcl`): the ACLs of brokers and name servers, RocketMQ 5.3's ACL 2.0 (issue #37).

An ACL belongs to a subject (`User:billing`) and holds entries; `create` and `update` make one
entry per resource of `--resources`, each with the same `--actions`, `--decision` and
`--source-ips`:

    rocketq admin acl create --subject User:billing --resources Topic:orders,Group:billing \\
        --actions Pub,Sub --decision Allow --source-ips 10.0.0.0/8 --cluster DefaultCluster

Resources are `Cluster`, `Topic:<name>`, `Group:<name>`, a prefix (`Topic:orders-*`) or `*`;
actions `Pub`, `Sub`, `Create`, `Update`, `Delete`, `Get`, `List`, `All`; `Deny` beats `Allow`.
Each is checked here (`auth.model`) before anything is sent. Targets as `admin.auth_targets`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from admin.auth_targets import (
    Outcome,
    Selection,
    get_command,
    report_changes,
    run_on_targets,
    show_rows,
    target_command,
)
from admin.base import admin_group, example_epilog
from auth.model import DECISIONS, AuthModelError, Resource, parse_actions, parse_networks, subject_user
from client.admin_api import AdminAPI
from protocol.bodies import AclEntryData, AclInfo


def _split(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _checked(parse: Callable[[str], object]) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    """A click callback running `parse` on the value (a usage error naming the option when it fails)."""
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                parse(value)
            except AuthModelError as exc:
                raise click.BadParameter(str(exc)) from None
        return value
    return callback


def _resources(value: str) -> None:
    if not _split(value):
        raise AuthModelError("name at least one resource")
    for item in _split(value):
        Resource.parse(item)


_SUBJECT = click.option("--subject", "-s", required=True, metavar="User:NAME", callback=_checked(subject_user),
                        help="Whose ACL: User:<name>.")
_RESOURCES = click.option("--resources", "-r", required=True, metavar="RESOURCE[,...]", callback=_checked(_resources),
                          help="Cluster, Topic:<name>, Group:<name>, a prefix (Topic:orders-*) or *; comma-separated.")
_ACTIONS = click.option("--actions", "-a", required=True, metavar="ACTION[,...]",
                        callback=_checked(lambda v: parse_actions(_split(v))),
                        help="Pub, Sub, Create, Update, Delete, Get, List or All; comma-separated.")
_DECISION = click.option("--decision", "-d", type=click.Choice(DECISIONS), default="Allow", show_default=True,
                         help="Allow or Deny (a matching Deny beats every Allow).")
_SOURCE_IPS = click.option("--source-ips", "-i", default=None, metavar="CIDR[,...]",
                           callback=_checked(lambda v: parse_networks(_split(v))),
                           help="Only from these networks or addresses (10.0.0.0/8,192.168.1.7); default: anywhere.")


def _entries(resources: str, actions: str, decision: str, source_ips: str | None) -> list[AclEntryData]:
    return [AclEntryData(resource=resource, actions=_split(actions), decision=decision,
                         source_ips=_split(source_ips)) for resource in _split(resources)]


@click.group("acl")
def acl_group() -> None:
    """ACLs of brokers and name servers: create, update, delete, get, list (authorization)."""


F = TypeVar("F", bound=Callable[..., Any])


def _entry_options(command: F) -> F:
    """The options of `create` and `update`: the subject, its entries, the targets."""
    for option in reversed((_SUBJECT, _RESOURCES, _ACTIONS, _DECISION, _SOURCE_IPS, target_command)):
        command = option(command)
    return command


def _write(verb: str, change: Callable[[AdminAPI, str, str, list[AclEntryData]], Awaitable[None]], subject: str,
           resources: str, actions: str, decision: str, source_ips: str | None, selection: Selection,
           endpoints: str, as_json: bool) -> None:
    entries = _entries(resources, actions, decision, source_ips)
    outcomes = run_on_targets(endpoints, selection, lambda api, address: change(api, address, subject, entries))
    report_changes(outcomes, f"{verb} ACL of {subject}: {decision} {','.join(_split(actions))} on "
                             f"{','.join(_split(resources))}", as_json)


@acl_group.command("create", epilog=example_epilog(
    "rocketq admin acl create --subject User:billing --resources Topic:orders,Group:billing --actions Pub,Sub "
    "--decision Allow --source-ips 10.0.0.0/8"))
@_entry_options
def create(subject: str, resources: str, actions: str, decision: str, source_ips: str | None,
           brokers: tuple[str, ...], cluster: str | None, namesrv: bool, endpoints: str, as_json: bool) -> None:
    """Add entries to a subject's ACL (created when it has none) on each target; refused where it
    already has an entry for one of the resources."""
    _write("created", AdminAPI.create_acl, subject, resources, actions, decision, source_ips,
           Selection(brokers, cluster, namesrv), endpoints, as_json)


@acl_group.command("update", epilog=example_epilog(
    "rocketq admin acl update --subject User:billing --resources Topic:orders --actions Pub --decision Deny "
    "--cluster DefaultCluster"))
@_entry_options
def update(subject: str, resources: str, actions: str, decision: str, source_ips: str | None,
           brokers: tuple[str, ...], cluster: str | None, namesrv: bool, endpoints: str, as_json: bool) -> None:
    """Replace (or add) the entries of these resources in a subject's ACL on each target."""
    _write("updated", AdminAPI.update_acl, subject, resources, actions, decision, source_ips,
           Selection(brokers, cluster, namesrv), endpoints, as_json)


@acl_group.command("delete", epilog=example_epilog(
    "rocketq admin acl delete --subject User:billing --resources Topic:orders --cluster DefaultCluster"))
@_SUBJECT
@click.option("--resources", "-r", default=None, metavar="RESOURCE[,...]", callback=_checked(_resources),
              help="Only the entries of these resource patterns (as written in the ACL); default: the whole ACL.")
@target_command
def delete(subject: str, resources: str | None, brokers: tuple[str, ...], cluster: str | None, namesrv: bool,
           endpoints: str, as_json: bool) -> None:
    """Delete a subject's ACL, or some of its entries, on each target."""
    outcomes = run_on_targets(endpoints, Selection(brokers, cluster, namesrv),
                              lambda api, address: api.delete_acl(address, subject, _split(resources)))
    what = f"entries {','.join(_split(resources))} of" if resources else "ACL of"
    report_changes(outcomes, f"deleted {what} {subject}", as_json)


def _show(outcomes: list[Outcome[list[AclInfo]]], as_json: bool, title: str) -> None:
    """One row per entry (subject, resource, actions, decision, source ips), an `at` column first
    when there is more than one target; exits 1 or 2 when a target failed."""
    rows = [{"at": o.target.label, "subject": acl.subject, "resource": entry.resource,
             "actions": ",".join(entry.actions), "decision": entry.decision,
             "source_ips": ",".join(entry.source_ips) or "*"}
            for o in outcomes for acl in o.value or () for entry in acl.entries]
    show_rows(outcomes, rows, ["subject", "resource", "actions", "decision", "source_ips"], as_json, title)


get_command(acl_group, "rocketq admin acl get --subject User:billing -b 127.0.0.1:10911", _SUBJECT,
            "Show a subject's ACL entries on each target.", AdminAPI.get_acl, _show, "ACL of {}")


@acl_group.command("list", epilog=example_epilog("rocketq admin acl list --resource-filter orders"))
@click.option("--subject-filter", "-s", default="", help="Only subjects containing this.")
@click.option("--resource-filter", "-r", default="", help="Only entries whose resource contains this.")
@target_command
def list_acls(subject_filter: str, resource_filter: str, brokers: tuple[str, ...], cluster: str | None,
              namesrv: bool, endpoints: str, as_json: bool) -> None:
    """List the ACLs of each target, an entry per row."""
    outcomes = run_on_targets(endpoints, Selection(brokers, cluster, namesrv),
                              lambda api, address: api.list_acls(address, subject_filter, resource_filter))
    _show(outcomes, as_json, "ACLs")


admin_group.add_command(acl_group)
admin_group.aliases.update({
    "createAcl": ["acl", "create"], "updateAcl": ["acl", "update"], "deleteAcl": ["acl", "delete"],
    "getAcl": ["acl", "get"], "listAcl": ["acl", "list"],
})
