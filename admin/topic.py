"""`rocketq admin topic create|update|delete|list|status|route` (mqadmin `updateTopic`,
`deleteTopic`, `topicList`, `topicStatus`, `topicRoute`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import click

from admin.base import admin_group, example_epilog
from admin.cluster import on_each_broker
from admin.common import CommandError, command_options, format_time_ms, print_json, run_admin, show, table
from client.admin_api import AdminAPI
from protocol.bodies import TopicStatsTable
from protocol.codes import Perm
from protocol.errors import SystemError_

_F = TypeVar("_F", bound=Callable[..., Any])


@admin_group.group("topic")
def topic_group() -> None:
    """Create, change, delete and inspect topics."""


def _perm_text(perm: int) -> str:
    letters = "".join(letter if perm & bit else "-" for letter, bit in (("R", Perm.READ), ("W", Perm.WRITE)))
    return f"{letters} ({perm})"


def _queue_options(command: _F) -> _F:
    for option in reversed([
        click.option("--topic", "-t", required=True, help="Topic name."),
        click.option("--queues", "-q", type=click.IntRange(1, 1024), default=None,
                     help="Read and write queue count. [default: 4 for create]"),
        click.option("--read-queues", "-r", type=click.IntRange(1, 1024), default=None, help="Read queue count."),
        click.option("--write-queues", "-w", type=click.IntRange(1, 1024), default=None, help="Write queue count."),
        click.option("--perm", "-p", type=click.IntRange(0, 15), default=None,
                     help="Permission bits: READ 4, WRITE 2 (6 = both). [default: 6 for create]"),
    ]):
        command = option(command)
    return command


async def write_topic(api: AdminAPI, address: str, topic: str, queues: int | None, read_queues: int | None,
                      write_queues: int | None, perm: int | None, *, refuse_existing: bool) -> dict[str, object]:
    """Create or update `topic` on the broker at `address`: `queues` sets read and write queue
    counts together, `read_queues` / `write_queues` one each; what is not given keeps the existing
    value (4 queues, read and write, for a new topic). Returns the config written. Raises
    `SystemError_` when `refuse_existing` and the topic exists, or the broker's refusal (mqadmin
    `updateTopic`; the console's create form calls it too)."""
    existing = {c.topic: c for c in await api.get_all_topic_config(address)}.get(topic)
    if refuse_existing and existing is not None:
        raise SystemError_(f"topic {topic!r} already exists (use `topic update`)")
    read = read_queues or queues or (existing.read_queue_nums if existing is not None else 4)
    write = write_queues or queues or (existing.write_queue_nums if existing is not None else read)
    final_perm = perm if perm is not None else (existing.perm if existing is not None else Perm.READ | Perm.WRITE)
    await api.update_topic(address, topic, read, write, final_perm)
    return {"topic": topic, "read_queue_nums": read, "write_queue_nums": write, "perm": final_perm}


async def _write_topic_on_cluster(api: AdminAPI, address: str, cluster: str, topic: str, queues: int | None,
                                  read_queues: int | None, write_queues: int | None, perm: int | None, *,
                                  refuse_existing: bool) -> list[dict[str, object]]:
    """`write_topic` on the master of every broker of `cluster`, as a name server at `address`
    lists them (GET_BROKER_CLUSTER_INFO; a broker given as the endpoint lists itself). Each
    broker registers the change with its name servers at once."""
    info = await api.get_broker_cluster_info(address)
    names = info.cluster_addr_table.get(cluster)
    if not names:
        known = ", ".join(sorted(info.cluster_addr_table)) or "none"
        raise CommandError(f"no broker of cluster {cluster!r} is registered at {address} (clusters: {known})")
    results = []
    for name in names:
        broker_address = info.broker_addr_table[name].broker_addrs.get(0)
        if broker_address is None:
            raise CommandError(f"broker {name!r} of cluster {cluster!r} has no master address")
        result = await write_topic(api, broker_address, topic, queues, read_queues, write_queues, perm,
                                    refuse_existing=refuse_existing)
        results.append({"broker_name": name, "broker_addr": broker_address, **result})
    return results


def _print_written(result: dict[str, object], as_json: bool, verb: str) -> None:
    if as_json:
        print_json(result)
    else:
        where = f" on {result['broker_name']} ({result['broker_addr']})" if "broker_name" in result else ""
        click.echo(f"{verb} topic {result['topic']}{where}: {result['read_queue_nums']} read / "
                   f"{result['write_queue_nums']} write queues, perm {_perm_text(int(str(result['perm'])))}")


def _write(endpoints: str, cluster: str | None, topic: str, queues: int | None, read_queues: int | None,
           write_queues: int | None, perm: int | None, as_json: bool, *, refuse_existing: bool) -> None:
    verb = "created" if refuse_existing else "updated"
    if cluster is None:
        result = run_admin(endpoints, lambda api, address: write_topic(
            api, address, topic, queues, read_queues, write_queues, perm, refuse_existing=refuse_existing))
        _print_written(result, as_json, verb)
        return
    results = run_admin(endpoints, lambda api, address: _write_topic_on_cluster(
        api, address, cluster, topic, queues, read_queues, write_queues, perm, refuse_existing=refuse_existing))
    if as_json:
        print_json(results)
        return
    for result in results:
        _print_written(result, False, verb)


_CLUSTER_OPTION = click.option(
    "--cluster", "-c", default=None, metavar="NAME",
    help="Create or change the topic on every broker of this cluster (--endpoints then names a name "
         "server, e.g. 127.0.0.1:9876); without it, on the one broker of --endpoints.")


def _write_command(name: str, example: str, *, refuse_existing: bool, summary: str) -> click.Command:
    """`topic create` (`refuse_existing`) or `topic update`: the same options and the same write."""
    @topic_group.command(name, help=summary, epilog=example_epilog(example))
    @_queue_options
    @_CLUSTER_OPTION
    @command_options
    def write(topic: str, queues: int | None, read_queues: int | None, write_queues: int | None, perm: int | None,
              cluster: str | None, endpoints: str, as_json: bool) -> None:
        _write(endpoints, cluster, topic, queues, read_queues, write_queues, perm, as_json,
               refuse_existing=refuse_existing)
    return write


create = _write_command(
    "create", "rocketq admin topic create --topic orders --queues 8", refuse_existing=True,
    summary="Create a topic (refused when it exists), on one broker or on every broker of a cluster.")
update = _write_command(
    "update", "rocketq admin topic update --topic orders --perm 4", refuse_existing=False,
    summary="Create a topic or change its queue counts or permission (what is not given is kept), on one\n"
         "broker or on every broker of a cluster.")


@topic_group.command("delete", epilog=example_epilog("rocketq admin topic delete --topic orders"))
@click.option("--topic", "-t", required=True, help="Topic name.")
@command_options
def delete(topic: str, endpoints: str, as_json: bool) -> None:
    """Delete a topic's config and every group's offsets on it (stored messages age out)."""
    run_admin(endpoints, lambda api, address: api.delete_topic(address, topic))
    if as_json:
        print_json({"deleted": topic})
    else:
        click.echo(f"deleted topic {topic}")


@topic_group.command("list", epilog=example_epilog("rocketq admin topic list -n 127.0.0.1:9876"))
@command_options
def list_topics(endpoints: str, as_json: bool) -> None:
    """Every topic of the broker with its queue counts and permission; through a name server
    (e.g. --endpoints 127.0.0.1:9876) every topic of every broker, a row per topic and broker."""
    found = run_admin(endpoints, lambda api, address: on_each_broker(api, address, api.get_all_topic_config))
    if not found.via_name_server:
        (topics,) = found.values()
        show(as_json, [dataclasses.asdict(t) for t in topics],
             table(f"{len(topics)} topics", ["topic", "read queues", "write queues", "perm"],
                   [[t.topic, t.read_queue_nums, t.write_queue_nums, _perm_text(t.perm)] for t in topics]))
        return
    pairs = sorted(((t, answer.broker_name) for answer in found.answers for t in answer.value),
                   key=lambda pair: (pair[0].topic, pair[1]))
    show(as_json, [{"broker_name": name, **dataclasses.asdict(t)} for t, name in pairs],
         table(f"{len({t.topic for t, _ in pairs})} topics on {len(found.answers)} brokers",
               ["topic", "broker", "read queues", "write queues", "perm"],
               [[t.topic, name, t.read_queue_nums, t.write_queue_nums, _perm_text(t.perm)] for t, name in pairs]))


@topic_group.command("status", epilog=example_epilog("rocketq admin topic status --topic orders"))
@click.option("--topic", "-t", required=True, help="Topic name.")
@command_options
def status(topic: str, endpoints: str, as_json: bool) -> None:
    """Per queue: min and max offset, messages held, and when the last message was stored; through
    a name server, the queues of every broker of the topic's route."""
    found = run_admin(endpoints, lambda api, address: on_each_broker(
        api, address, lambda broker: api.get_topic_stats(broker, topic), topic=topic))
    queues = [q for stats in found.values() for q in stats.offset_table]
    rows = [[q.broker_name, q.queue_id, q.min_offset, q.max_offset, q.max_offset - q.min_offset,
             format_time_ms(q.last_update_timestamp)] for q in queues]
    total = sum(q.max_offset - q.min_offset for q in queues)
    show(as_json, dataclasses.asdict(TopicStatsTable(offset_table=queues)),
         table(f"topic {topic}: {total} messages",
               ["broker", "queue", "min offset", "max offset", "messages", "last stored"], rows))


@topic_group.command("route", epilog=example_epilog("rocketq admin topic route --topic orders"))
@click.option("--topic", "-t", required=True, help="Topic name.")
@command_options
def route(topic: str, endpoints: str, as_json: bool) -> None:
    """Which brokers serve the topic, at which address, with how many queues."""
    data = run_admin(endpoints, lambda api, address: api.get_route_info(address, topic))
    addresses = {b.broker_name: b for b in data.broker_datas}
    rows = []
    for queue in data.queue_datas:
        broker = addresses.get(queue.broker_name)
        rows.append([broker.cluster if broker else "", queue.broker_name,
                     ", ".join(f"{i}={a}" for i, a in sorted(broker.broker_addrs.items())) if broker else "",
                     queue.read_queue_nums, queue.write_queue_nums, _perm_text(queue.perm)])
    show(as_json, dataclasses.asdict(data),
         table(f"route of {topic}", ["cluster", "broker", "addresses (id=host:port)", "read queues",
                                     "write queues", "perm"], rows))


admin_group.aliases.update({
    "updateTopic": ["topic", "update"], "deleteTopic": ["topic", "delete"], "topicList": ["topic", "list"],
    "topicStatus": ["topic", "status"], "topicRoute": ["topic", "route"],
})
