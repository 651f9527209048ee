"""`rocketq admin offset reset` (mqadmin `resetOffsetByTime`): move a group's committed offsets on a
topic while its consumers run. The broker commits the new offsets and tells every consumer of the
group (RESET_CONSUMER_CLIENT_OFFSET); they drop the queues and reload them from the new offsets.
Prints the before/after table."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import click

from admin.base import admin_group, example_epilog
from admin.common import command_options, run_admin, show, table
from protocol.headers import ResetOffsetRequestHeader


@admin_group.group("offset")
def offset_group() -> None:
    """Change a consumer group's committed offsets."""


def parse_timestamp_ms(value: str) -> int:
    """Epoch milliseconds, an ISO date-time ("2026-11-23T09:30:00", local time unless it has an
    offset) or RocketMQ's "yyyy-MM-dd#HH:mm:ss:SSS"; raises `click.BadParameter`."""
    if value.isdigit():
        return int(value)
    for parse in (datetime.fromisoformat, lambda v: datetime.strptime(v, "%Y-%m-%d#%H:%M:%S:%f")):
        try:
            return int(parse(value).timestamp() * 1000)
        except ValueError:
            continue
    raise click.BadParameter(f"{value!r} is not epoch ms, an ISO date-time or yyyy-MM-dd#HH:mm:ss:SSS",
                             param_hint="--timestamp")


@offset_group.command("reset", epilog=example_epilog(
    "rocketq admin offset reset --group billing --topic orders --to-earliest"))
@click.option("--group", "-g", required=True, help="Consumer group name.")
@click.option("--topic", "-t", required=True, help="Topic name.")
@click.option("--timestamp", "-s", default=None, metavar="TIME",
              help="Move every queue to the first message stored at or after TIME (epoch ms or ISO date-time).")
@click.option("--to-earliest", is_flag=True, help="Move every queue to its first offset (consume everything again).")
@click.option("--to-latest", is_flag=True, help="Move every queue to its end (skip the backlog).")
@click.option("--queue", "-q", "queue_id", type=click.IntRange(0), default=None,
              help="Only this queue (with --offset).")
@click.option("--offset", "-o", "queue_offset", type=click.IntRange(0), default=None, help="The queue's new offset.")
@click.option("--force/--no-force", default=True, show_default=True,
              help="--no-force only moves a queue back, never forward (RocketMQ's isForce).")
@command_options
def reset(group: str, topic: str, timestamp: str | None, to_earliest: bool, to_latest: bool, queue_id: int | None,
          queue_offset: int | None, force: bool, endpoints: str, as_json: bool) -> None:
    """Reset GROUP's offsets on TOPIC, live: name exactly one of --timestamp, --to-earliest,
    --to-latest, or --queue with --offset."""
    if (queue_id is None) != (queue_offset is None):
        raise click.UsageError("--queue and --offset go together")
    chosen = [timestamp is not None, to_earliest, to_latest, queue_id is not None]
    if sum(chosen) != 1:
        raise click.UsageError("name exactly one of --timestamp, --to-earliest, --to-latest, --queue/--offset")
    header = ResetOffsetRequestHeader(
        topic=topic, group=group, is_force=force,
        timestamp=parse_timestamp_ms(timestamp) if timestamp is not None else -1,
        to_where="EARLIEST" if to_earliest else "LATEST" if to_latest else None,
        queue_id=-1 if queue_id is None else queue_id, offset=-1 if queue_offset is None else queue_offset)
    result = run_admin(endpoints, lambda api, address: api.reset_offset(address, header))
    rows = [[q.topic, q.broker_name, q.queue_id, "-" if q.before < 0 else q.before, q.after,
             q.after - max(q.before, 0)] for q in result.offset_table]
    show(as_json, dataclasses.asdict(result),
         table(f"offsets of {group} on {topic} reset; its consumers reload the queues",
               ["topic", "broker", "queue", "before", "after", "moved"], rows))


admin_group.aliases.update({"resetOffsetByTime": ["offset", "reset"], "resetOffset": ["offset", "reset"]})
