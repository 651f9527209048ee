"""`rocketq admin consumer progress|connection|status` (mqadmin `consumerProgress`,
`consumerConnection`, `consumerStatus`).

`progress`: per queue the broker offset, the committed offset, the lag in messages and in time, and
the client owning the queue now (asked of each client through GET_CONSUMER_RUNNING_INFO), with
totals; through a name server, of every broker of the cluster. `status`: each client's
subscriptions and process queues (cached count and bytes, locked, last pull and consume time)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import click

from admin.base import admin_group, example_epilog
from admin.cluster import BrokerAnswers, on_each_broker
from admin.common import (
    CommandError,
    command_options,
    format_bytes,
    format_duration_ms,
    format_time_ms,
    run_admin,
    show,
    table,
)
from client.admin_api import AdminAPI
from protocol.bodies import ConsumerConnection, ConsumerRunningInfo, ConsumeStats
from protocol.errors import ConsumerNotOnline, MQError


@admin_group.group("consumer")
def consumer_group() -> None:
    """Inspect a consumer group: progress (lag), connections, and each client's state."""


async def running_infos(api: AdminAPI, addresses: Sequence[str], group: str
                        ) -> tuple[ConsumerConnection | None, list[ConsumerRunningInfo]]:
    """The group's connections on the brokers at `addresses` (the first answer, with the clients
    the others list added; None when no consumer is online on any) and each client's running info,
    asked once through a broker it is connected to (clients that do not answer are left out)."""
    connection: ConsumerConnection | None = None
    via: dict[str, str] = {}                 # client id -> the address of a broker that lists it
    for address in addresses:
        try:
            found = await api.get_consumer_connection_list(address, group)
        except ConsumerNotOnline:
            continue
        added = [c for c in found.connection_set if c.client_id not in via]
        connection = found if connection is None else dataclasses.replace(
            connection, connection_set=[*connection.connection_set, *added])
        via.update((c.client_id, address) for c in added)
    infos = []
    for client_id, address in via.items():
        try:
            infos.append(await api.get_consumer_running_info(address, group, client_id))
        except MQError:
            continue
    return connection, infos


OwnerKey = tuple[str, str, int]
"""(broker_name, topic, queue_id) of a message queue."""


def owners(infos: list[ConsumerRunningInfo]) -> dict[OwnerKey, str]:
    """(broker_name, topic, queue_id) → client id holding that process queue (not dropped)."""
    return {(q.broker_name, q.topic, q.queue_id): info.client_id
            for info in infos for q in info.mq_table if not q.dropped}


async def _progress(api: AdminAPI, endpoint: str, group: str, topic: str | None
                    ) -> tuple[BrokerAnswers[ConsumeStats], dict[OwnerKey, str]]:
    """Every broker's consume stats of the group and the queues' owners; `CommandError` when no
    broker has a queue for it (RocketMQ: "not found the consumer group consume stats")."""
    found = await on_each_broker(api, endpoint, lambda address: api.get_consume_stats(address, group, topic))
    if not any(stats.offset_table for stats in found.values()):
        where = f" for topic {topic!r}" if topic else ""
        raise CommandError(f"consumer group {group!r} has no offset info and no consumer online{where}"
                           f"{' on any broker' if found.via_name_server else ''} (is the group name right?)")
    _, infos = await running_infos(api, [answer.address for answer in found.answers], group)
    return found, owners(infos)


async def _online(api: AdminAPI, address: str, group: str) -> tuple[ConsumerConnection, list[ConsumerRunningInfo]]:
    """`running_infos` of one broker; `CommandError` when no consumer of the group is online."""
    connection, infos = await running_infos(api, [address], group)
    if connection is None:
        raise CommandError(f"consumer group {group!r} has no consumer online (is the group name right?)")
    return connection, infos


async def progress_report(api: AdminAPI, endpoint: str, group: str, topic: str | None = None) -> dict[str, Any]:
    """What `consumer progress --json` prints (the console shows the same): `{"consumer_group",
    "queues": [ConsumeStats queue fields + "lag" (messages, never negative) + "owner" (client id or
    "")], "total_lag", "consume_tps", "max_lag_latency_ms"}`; raises `CommandError` when no broker
    has offsets for the group (RocketMQ's consumerProgress)."""
    found, owner = await _progress(api, endpoint, group, topic)
    queues = [q for stats in found.values() for q in stats.offset_table]
    rows = [dataclasses.asdict(q) | {"lag": max(0, q.broker_offset - q.consumer_offset),
                                     "owner": owner.get((q.broker_name, q.topic, q.queue_id), "")} for q in queues]
    return {"consumer_group": group, "queues": rows, "total_lag": sum(int(r["lag"]) for r in rows),
            "consume_tps": sum(stats.consume_tps for stats in found.values()),
            "max_lag_latency_ms": max((q.lag_latency_ms for q in queues), default=0)}


@consumer_group.command("progress", epilog=example_epilog("rocketq admin consumer progress --group billing"))
@click.option("--group", "-g", required=True, help="Consumer group name.")
@click.option("--topic", "-t", default=None, help="Only this topic.")
@command_options
def progress(group: str, topic: str | None, endpoints: str, as_json: bool) -> None:
    """Per queue: broker offset, consumer offset, lag (messages and time) and owning client, with
    totals; through a name server (e.g. --endpoints 127.0.0.1:9876) the queues of every broker."""
    report = run_admin(endpoints, lambda api, address: progress_report(api, address, group, topic))
    rows, total_lag = report["queues"], report["total_lag"]
    lines = [[q["topic"], q["broker_name"], q["queue_id"], q["broker_offset"], q["consumer_offset"], q["lag"],
              format_duration_ms(q["lag_latency_ms"]), format_time_ms(q["last_timestamp"]), q["owner"]]
             for q in rows]
    shown = {key: report[key] for key in ("consumer_group", "queues", "total_lag", "consume_tps")}
    show(as_json, shown,
         table(f"group {group}: total lag {total_lag}, oldest unconsumed "
               f"{format_duration_ms(report['max_lag_latency_ms'])}",
               ["topic", "broker", "queue", "broker offset", "consumer offset", "lag", "lag time",
                "last consumed", "owner"], lines))


@consumer_group.command("connection", epilog=example_epilog("rocketq admin consumer connection --group billing"))
@click.option("--group", "-g", required=True, help="Consumer group name.")
@command_options
def connection(group: str, endpoints: str, as_json: bool) -> None:
    """The group's connected clients, its subscriptions and message model."""
    data = run_admin(endpoints, lambda api, address: api.get_consumer_connection_list(address, group))
    show(as_json, dataclasses.asdict(data),
         table(f"group {group}: {len(data.connection_set)} client(s), {data.consume_type} {data.message_model}, "
               f"{data.consume_from_where}", ["client id", "address", "language", "version", "last heartbeat"],
               [[c.client_id, c.client_addr, c.language, c.version, format_time_ms(c.last_heartbeat_ms)]
                for c in data.connection_set]),
         table("subscriptions", ["topic", "expression", "type", "version"],
               [[s.topic, s.sub_string, s.expression_type, s.sub_version] for s in data.subscription_table]))


@consumer_group.command("status", epilog=example_epilog("rocketq admin consumer status --group billing --json"))
@click.option("--group", "-g", required=True, help="Consumer group name.")
@command_options
def status(group: str, endpoints: str, as_json: bool) -> None:
    """Each client's subscriptions and process queues: cached messages and bytes, locked, last
    pull and last consume time."""
    connection_data, infos = run_admin(endpoints, lambda api, address: _online(api, address, group))
    now_ms = int(time.time() * 1000)
    tables = []
    for info in infos:
        subscriptions = ", ".join(f"{s.topic} ({s.sub_string})" for s in info.subscriptions)
        rows = [[q.topic, q.queue_id, q.committed_offset, q.cached_msg_count, format_bytes(q.cached_msg_size_bytes),
                 "yes" if q.locked else "no", "yes" if q.dropped else "no",
                 f"{format_duration_ms(now_ms - q.last_pull_at_ms)} ago" if q.last_pull_at_ms else "-",
                 f"{format_duration_ms(now_ms - q.last_consume_at_ms)} ago" if q.last_consume_at_ms else "-"]
                for q in info.mq_table]
        tables.append(table(f"client {info.client_id} ({info.message_model}) subscribes {subscriptions}",
                            ["topic", "queue", "committed", "cached msgs", "cached bytes", "locked", "dropped",
                             "last pull", "last consume"], rows))
    show(as_json, {"consumer_group": group, "message_model": connection_data.message_model,
                   "clients": [dataclasses.asdict(i) for i in infos]}, *tables)


admin_group.aliases.update({
    "consumerProgress": ["consumer", "progress"], "consumerConnection": ["consumer", "connection"],
    "consumerStatus": ["consumer", "status"],
})
