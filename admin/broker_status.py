"""`rocketq admin broker status` (mqadmin `brokerStatus`): version, uptime, store sizes and disk use,
held pulls, connections, counts, and the config keys that differ from the defaults."""

from __future__ import annotations

import dataclasses

from admin.cli import admin_group
from admin.common import (
    endpoints_option,
    format_bytes,
    format_duration_ms,
    format_time_ms,
    json_option,
    print_json,
    print_tables,
    run_admin,
    table,
)


@admin_group.group("broker")
def broker_group() -> None:
    """Inspect a running broker."""


@broker_group.command("status")
@endpoints_option
@json_option
def status(endpoints: str, as_json: bool) -> None:
    """Version, uptime, store and disk, held pulls, connections, config changed from defaults."""
    info = run_admin(endpoints, lambda api, address: api.get_broker_runtime_info(address))
    if as_json:
        print_json(dataclasses.asdict(info))
        return
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
        ["held pulls", str(info.held_pulls)],
        ["connections", str(info.connections)],
        ["topics / groups", f"{info.topic_count} / {info.group_count}"],
    ]
    diff = [[key, default, value] for key, (default, value) in info.config_diff.items()]
    print_tables(table("broker status", ["", ""], rows),
                 table("config changed from the defaults", ["key", "default", "value"], diff))


admin_group.aliases.update({"brokerStatus": ["broker", "status"]})
