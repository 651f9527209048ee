"""`rocketq admin broker status` (mqadmin `brokerStatus`): version, uptime, store sizes and disk use,
messages in and out (per second over the last ~10 s, RocketMQ's putTps / getTransferedTps, and
totals since the start), held pulls, connections, counts, and the config keys that differ from
the defaults."""

from __future__ import annotations

import dataclasses

from rich.table import Table

from admin.base import admin_group, example_epilog
from admin.cluster import on_each_broker
from admin.common import command_options, format_bytes, format_duration_ms, format_time_ms, run_admin, show, table
from protocol.bodies import BrokerRuntimeInfo


@admin_group.group("broker")
def broker_group() -> None:
    """Inspect a running broker."""


def status_tables(info: BrokerRuntimeInfo) -> list[Table]:
    """One broker's block: its status, then the config keys that differ from the defaults."""
    rows = [
        ["broker", f"{info.broker_name} ({info.cluster_name}) at {info.address}"],
        ["version", info.version],
        ["started", format_time_ms(info.started_at_ms)],
        ["uptime", format_duration_ms(info.uptime_ms)],
        ["commit log", f"offsets [{info.commit_log_min_offset}, {info.commit_log_max_offset}), "
                       f"{format_bytes(info.commit_log_max_offset - info.commit_log_min_offset)}"],
        ["not yet fsynced / dispatched", f"{format_bytes(info.flush_behind_bytes)} / "
                                         f"{format_bytes(info.dispatch_behind_bytes)}"],
        ["store", f"{info.store_path}: {format_bytes(info.store_bytes)} on disk"],
        ["disk", f"{info.disk_used_ratio:.1%} used, {format_bytes(info.disk_free_bytes)} free of "
                 f"{format_bytes(info.disk_total_bytes)}"],
        ["messages in / out", f"{info.put_tps:.1f} / {info.get_tps:.1f} msg/s, "
                              f"{info.msg_put_total} / {info.msg_get_total} since the start"],
        ["held pulls", str(info.held_pulls)],
        ["connections", str(info.connections)],
        ["topics / groups", f"{info.topic_count} / {info.group_count}"],
    ]
    diff = [[key, default, value] for key, (default, value) in info.config_diff.items()]
    return [table(f"broker status of {info.broker_name}", ["", ""], rows),
            table("config changed from the defaults", ["key", "default", "value"], diff)]


@broker_group.command("status", epilog=example_epilog("rocketq admin broker status -n 127.0.0.1:9876"))
@command_options
def status(endpoints: str, as_json: bool) -> None:
    """Version, uptime, store and disk, messages in/out per second, held pulls, connections, config
    changed from defaults; through a name server (e.g. --endpoints 127.0.0.1:9876) a block per
    broker of the cluster (with --json, a list)."""
    found = run_admin(endpoints, lambda api, address: on_each_broker(api, address, api.get_broker_runtime_info))
    infos = found.values()
    show(as_json, [dataclasses.asdict(i) for i in infos] if found.via_name_server else dataclasses.asdict(infos[0]),
         *(block for info in infos for block in status_tables(info)))


admin_group.aliases.update({"brokerStatus": ["broker", "status"]})
