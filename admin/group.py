"""`rocketq admin group create|update|delete|list` (mqadmin `updateSubGroup`, `deleteSubGroup`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import click

from admin.base import admin_group, example_epilog
from admin.cluster import on_each_broker
from admin.common import command_options, print_json, run_admin, show, table
from client.admin_api import AdminAPI
from protocol.errors import SystemError_
from protocol.headers import MAX_BROKER_ID, CreateSubscriptionGroupRequestHeader

_F = TypeVar("_F", bound=Callable[..., Any])


@admin_group.group("group")
def group_group() -> None:
    """Create, change, delete and list subscription (consumer) groups."""


def _group_options(command: _F) -> _F:
    for option in reversed([
        click.option("--group", "-g", required=True, help="Consumer group name."),
        click.option("--consume-enable/--consume-disable", default=None,
                     help="Whether the group may consume. [default: enabled for create]"),
        click.option("--broadcast-enable/--broadcast-disable", default=None,
                     help="Whether the group may consume in broadcasting mode. [default: enabled]"),
        click.option("--retry-queues", type=click.IntRange(0, 1024), default=None,
                     help="Queues of the group's %RETRY% topic. [default: 1]"),
        click.option("--retry-max-times", type=click.IntRange(0, 10_000), default=None,
                     help="Redeliveries before a message goes to the DLQ. [default: 16]"),
        click.option("--fifo/--no-fifo", "fifo", default=None,
                     help="A FIFO group (consume_message_orderly): POP hands each queue out in order. "
                          "[default: off]"),
        click.option("--broker-id", "-i", type=click.IntRange(0, MAX_BROKER_ID), default=None,
                     help="With slave_read_enable: the broker id pulls of messages still in memory are sent to "
                          "(mqadmin -i). [default: 0, the master]"),
        click.option("--which-broker-when-consume-slowly", "-w", type=click.IntRange(0, MAX_BROKER_ID),
                     default=None, help="With slave_read_enable: the broker id pulls far behind the log's end are "
                                        "sent to (mqadmin -w). [default: 1, a slave]"),
    ]):
        command = option(command)
    return command


@dataclasses.dataclass(frozen=True)
class GroupChange:
    """What `group create|update` sets; None: kept (update) or the default (create)."""

    consume_enable: bool | None = None
    broadcast_enable: bool | None = None
    retry_queues: int | None = None
    retry_max_times: int | None = None
    fifo: bool | None = None
    broker_id: int | None = None
    which_broker_when_consume_slowly: int | None = None


async def _write_group(api: AdminAPI, address: str, group: str, change: GroupChange,
                       *, refuse_existing: bool) -> CreateSubscriptionGroupRequestHeader:
    existing = {g.group_name: g for g in await api.get_all_subscription_groups(address)}.get(group)
    if refuse_existing and existing is not None:
        raise SystemError_(f"group {group!r} already exists (use `group update`)")
    base = existing if existing is not None else CreateSubscriptionGroupRequestHeader(group_name=group)

    def pick(given: Any, kept: Any) -> Any:
        return kept if given is None else given
    header = CreateSubscriptionGroupRequestHeader(
        group_name=group,
        consume_enable=pick(change.consume_enable, base.consume_enable),
        consume_broadcast_enable=pick(change.broadcast_enable, base.consume_broadcast_enable),
        retry_queue_nums=pick(change.retry_queues, base.retry_queue_nums),
        retry_max_times=pick(change.retry_max_times, base.retry_max_times),
        consume_message_orderly=pick(change.fifo, base.consume_message_orderly),
        broker_id=pick(change.broker_id, base.broker_id),
        which_broker_when_consume_slowly=pick(change.which_broker_when_consume_slowly,
                                              base.which_broker_when_consume_slowly))
    await api.create_subscription_group(address, header)
    return header


def _print_written(header: CreateSubscriptionGroupRequestHeader, as_json: bool, verb: str) -> None:
    if as_json:
        print_json(header.to_fields())
    else:
        click.echo(f"{verb} group {header.group_name}: consume {'on' if header.consume_enable else 'off'}, "
                   f"broadcast {'on' if header.consume_broadcast_enable else 'off'}, "
                   f"{header.retry_queue_nums} retry queue(s), retry max {header.retry_max_times}"
                   f"{', fifo' if header.consume_message_orderly else ''}"
                   f"{_broker_ids(header.broker_id, header.which_broker_when_consume_slowly)}")


def _broker_ids(broker_id: int, slowly: int) -> str:
    """", pulls to broker 0 (slowly: 1)" when either differs from the defaults, else ""."""
    return "" if (broker_id, slowly) == (0, 1) else f", pulls to broker {broker_id} (slowly: {slowly})"


def _write_command(name: str, example: str, *, refuse_existing: bool, summary: str) -> click.Command:
    """`group create` (`refuse_existing`) or `group update`: the same options and the same write."""
    verb = "created" if refuse_existing else "updated"

    @group_group.command(name, help=summary, epilog=example_epilog(example))
    @_group_options
    @command_options
    def write(group: str, endpoints: str, as_json: bool, **change: Any) -> None:
        header = run_admin(endpoints, lambda api, address: _write_group(
            api, address, group, GroupChange(**change), refuse_existing=refuse_existing))
        _print_written(header, as_json, verb)
    return write


create = _write_command(
    "create", "rocketq admin group create --group billing --retry-max-times 5", refuse_existing=True,
    summary="Create a subscription group (refused when it exists).")
update = _write_command(
    "update", "rocketq admin group update --group billing --consume-disable", refuse_existing=False,
    summary="Create a subscription group or change it (what is not given is kept).")


@group_group.command("delete", epilog=example_epilog("rocketq admin group delete --group billing"))
@click.option("--group", "-g", required=True, help="Consumer group name.")
@click.option("--keep-offsets", is_flag=True, help="Keep the group's committed offsets.")
@command_options
def delete(group: str, keep_offsets: bool, endpoints: str, as_json: bool) -> None:
    """Delete a subscription group (and, unless --keep-offsets, its committed offsets)."""
    run_admin(endpoints,
              lambda api, address: api.delete_subscription_group(address, group, clean_offset=not keep_offsets))
    if as_json:
        print_json({"deleted": group, "offsets_kept": keep_offsets})
    else:
        click.echo(f"deleted group {group}" + (" (offsets kept)" if keep_offsets else ""))


@group_group.command("list", epilog=example_epilog("rocketq admin group list -n 127.0.0.1:9876 --json"))
@command_options
def list_groups(endpoints: str, as_json: bool) -> None:
    """Every subscription group of the broker; through a name server (e.g. --endpoints
    127.0.0.1:9876) every group of every broker, a row per group and broker."""
    found = run_admin(endpoints, lambda api, address: on_each_broker(api, address, api.get_all_subscription_groups))
    pairs = sorted(((g, answer.broker_name) for answer in found.answers for g in answer.value),
                   key=lambda pair: (pair[0].group_name, pair[1]))
    columns = ["group", "consume", "broadcast", "retry queues", "retry max times"]
    rows = [[g.group_name, "on" if g.consume_enable else "off", "on" if g.consume_broadcast_enable else "off",
             g.retry_queue_nums, g.retry_max_times] for g, _ in pairs]
    if not found.via_name_server:
        show(as_json, [dataclasses.asdict(g) for g, _ in pairs], table(f"{len(pairs)} groups", columns, rows))
        return
    show(as_json, [{"broker_name": name, **dataclasses.asdict(g)} for g, name in pairs],
         table(f"{len({g.group_name for g, _ in pairs})} groups on {len(found.answers)} brokers",
               [columns[0], "broker", *columns[1:]], [[row[0], name, *row[1:]] for row, (_, name) in zip(
                   rows, pairs, strict=True)]))


admin_group.aliases.update({
    "updateSubGroup": ["group", "update"], "deleteSubGroup": ["group", "delete"], "groupList": ["group", "list"],
})
