"""What `rocketq top` shows, as pure functions of its snapshots: a row per (group, topic, queue),
their sort, and a table that fits the screen. On a narrow screen (80 columns) the numbers (queue,
lag, lag time, in/s, out/s) keep their full width; the owner (a long client id) is cut with `…`
first, then the topic, then the group."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from admin.common import format_duration_ms
from admin.consumer import OwnerKey
from protocol.bodies import BrokerRuntimeInfo, QueueConsumeStats

SORTS = ("lag", "tps", "topic", "group")
"""lag: most lag first; tps: fastest consumed (out/s) first; topic, group: by name."""
COLUMNS = ("group", "topic", "queue", "lag", "lag time", "in/s", "out/s", "owner")
RIGHT_ALIGNED = frozenset({"queue", "lag", "in/s", "out/s"})
CUT_FIRST = ("owner", "topic", "group")     # the columns narrowed on a narrow screen, in this order
MIN_CUT_WIDTH = 6
COLUMN_OVERHEAD = 3                         # a rule and a space each side, per column (and 1 more)


@dataclass
class Snapshot:
    """One refresh: stats per group, owners, broker info, and when it was taken."""

    at_s: float
    broker: BrokerRuntimeInfo
    queues: dict[str, list[QueueConsumeStats]] = field(default_factory=dict)
    owners: dict[str, dict[OwnerKey, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopRow:
    """One queue of a group; rates in messages per second, None before a second snapshot."""

    group: str
    topic: str
    queue_id: int
    lag: int
    lag_latency_ms: int
    rate_in: float | None
    rate_out: float | None
    owner: str

    def cells(self) -> list[str]:
        rates = ["-" if rate is None else f"{rate:.1f}" for rate in (self.rate_in, self.rate_out)]
        return [self.group, self.topic, str(self.queue_id), str(self.lag), format_duration_ms(self.lag_latency_ms),
                *rates, self.owner]


def top_rows(snapshot: Snapshot, previous: Snapshot | None) -> list[TopRow]:
    """A row per (group, topic, queue) of `snapshot`, rates since `previous`."""
    elapsed = snapshot.at_s - previous.at_s if previous else 0.0
    before = {(g, q.broker_name, q.topic, q.queue_id): q
              for g, qs in (previous.queues.items() if previous else []) for q in qs}
    rows = []
    for group, queues in snapshot.queues.items():
        for q in queues:
            old = before.get((group, q.broker_name, q.topic, q.queue_id))
            rate_in = rate_out = None
            if old is not None and elapsed > 0:
                rate_in = (q.broker_offset - old.broker_offset) / elapsed
                rate_out = max(0, q.consumer_offset - old.consumer_offset) / elapsed
            rows.append(TopRow(group, q.topic, q.queue_id, max(0, q.broker_offset - q.consumer_offset),
                               q.lag_latency_ms, rate_in, rate_out,
                               snapshot.owners.get(group, {}).get((q.broker_name, q.topic, q.queue_id), "")))
    return rows


def sort_rows(rows: list[TopRow], sort: str) -> list[TopRow]:
    """`rows` in `sort` order (one of `SORTS`); ties by group, topic, queue."""
    def by_name(row: TopRow) -> tuple[str, str, int]:
        return row.group, row.topic, row.queue_id
    if sort == "lag":
        return sorted(rows, key=lambda r: (-r.lag, by_name(r)))
    if sort == "tps":
        return sorted(rows, key=lambda r: (-(r.rate_out or 0.0), -r.lag, by_name(r)))
    if sort == "topic":
        return sorted(rows, key=lambda r: (r.topic, r.group, r.queue_id))
    return sorted(rows, key=by_name)


def next_sort(sort: str) -> str:
    """The sort after `sort` in `SORTS` (the `s` key), round and round."""
    return SORTS[(SORTS.index(sort) + 1) % len(SORTS)]


def column_widths(cells: list[list[str]], width: int) -> list[int]:
    """Each column's width on a screen `width` wide: its widest cell or heading; when the table is
    wider than the screen, `CUT_FIRST` columns are narrowed in order, each down to
    `MIN_CUT_WIDTH` at most; the others keep their width (a screen too narrow even then is the
    terminal's to wrap)."""
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(COLUMNS)]
    excess = sum(widths) + COLUMN_OVERHEAD * len(COLUMNS) + 1 - width
    for name in CUT_FIRST:
        index = COLUMNS.index(name)
        cut = max(0, min(excess, widths[index] - MIN_CUT_WIDTH))
        widths[index] -= cut
        excess -= cut
    return widths


def render(snapshot: Snapshot, previous: Snapshot | None, address: str, *, sort: str, width: int,
           keys: bool) -> Group:
    """The screen: a header line and one table of every (group, topic, queue) in `sort` order,
    fitting `width` columns; the header names the keys when `keys` can be read."""
    rows = sort_rows(top_rows(snapshot, previous), sort)
    cells = [row.cells() for row in rows]
    table = Table(expand=True)
    for name, column_width in zip(COLUMNS, column_widths(cells, width), strict=True):
        table.add_column(name, justify="right" if name in RIGHT_ALIGNED else "left", no_wrap=True,
                         overflow="ellipsis", width=column_width)
    for row_cells in cells:
        table.add_row(*row_cells)
    info = snapshot.broker
    hint = "  (s sorts, q quits)" if keys else ""
    header = Text(f"rocketq top  {info.broker_name} at {address}  up {format_duration_ms(info.uptime_ms)}  "
                  f"held pulls {info.held_pulls}  connections {info.connections}  groups {len(snapshot.queues)}  "
                  f"total lag {sum(row.lag for row in rows)}  sort: {sort}{hint}", style="bold")
    return Group(header, table)
