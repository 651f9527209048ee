"""What the demo prints at the end: a table per carrier and the run's figures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from demo.flights import CarrierStats, totals


@dataclass(frozen=True, slots=True)
class Figures:
    """Counts and timings of one run (seconds; rates in messages per second, 0 when not measured)."""

    rows: int
    sent: int
    consumed: int
    duplicates: int
    bad_messages: int
    send_s: float
    end_to_end_s: float
    elapsed_s: float

    @property
    def send_rate(self) -> float:
        return self.sent / self.send_s if self.send_s > 0 else 0.0

    @property
    def end_to_end_rate(self) -> float:
        return self.consumed / self.end_to_end_s if self.end_to_end_s > 0 else 0.0


_FIELDS = ("flights", "delay_sum", "delay_missing")


def _cell(consumed: int | None, expected: int | None) -> str:
    if consumed == expected:
        return f"{consumed:,}"
    shown = "-" if consumed is None else f"{consumed:,}"
    return f"[red]{shown} (CSV: {'-' if expected is None else f'{expected:,}'})[/red]"


def carrier_table(expected: Mapping[str, CarrierStats], consumed: Mapping[str, CarrierStats]) -> Table:
    """One row per carrier (consumed figures; the CSV's beside them in red where they differ), then a total."""
    table = Table(title="Flights per carrier: consumed vs. CSV")
    for name, justify in (("carrier", "left"), ("flights", "right"), ("dep_delay sum (min)", "right"),
                          ("dep_delay missing", "right"), ("OK", "center")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for carrier in sorted(set(expected) | set(consumed)):
        e, c = expected.get(carrier), consumed.get(carrier)
        cells = [_cell(None if c is None else getattr(c, f), None if e is None else getattr(e, f)) for f in _FIELDS]
        table.add_row(carrier, *cells, "[green]OK[/green]" if e == c else "[red]DIFF[/red]")
    e_total, c_total = totals(expected.values()), totals(consumed.values())
    table.add_section()
    table.add_row("all", *(_cell(getattr(c_total, f), getattr(e_total, f)) for f in _FIELDS),
                  "[green]OK[/green]" if e_total == c_total else "[red]DIFF[/red]")
    return table


def _rate(count: int, seconds: float, what: str) -> str:
    if seconds <= 0:
        return f"{count:,} {what} (did not finish)"
    return f"{count:,} {what} in {seconds:.2f} s = [bold]{count / seconds:,.0f} msg/s[/bold]"


def print_figures(console: Console, figures: Figures) -> None:
    console.print(f"sent:        {_rate(figures.sent, figures.send_s, f'of {figures.rows:,} messages')}")
    end_to_end = _rate(figures.consumed, figures.end_to_end_s, "consumed")
    console.print(f"end-to-end:  {end_to_end} (first send to last consumed)")
    console.print(f"duplicates:  {figures.duplicates:,} (dropped by unique key)"
                  + (f"; [red]{figures.bad_messages:,} bad messages[/red]" if figures.bad_messages else ""))
    console.print(f"elapsed:     {figures.elapsed_s:.2f} s in all (loading, broker, replay, shutdown)")
