"""What a comparison produces: a `Side` per system and workload (value, delivery check, details), a
`Row` pairing the two with the ratio rocketq/Redis and its target, the table and the JSON file.

A target bounds the ratio: `("≥", 1.5)` (rocketq at least 1.5 times Redis: throughput), `("≤", 0.5)`
(rocketq at most half of Redis: latency, time), or `("≤+", slack)`: rocketq ≤ Redis + slack in the
row's unit (idle CPU, where both are near zero and a ratio means nothing), or `("≤abs", bound)`:
rocketq ≤ bound in the row's unit whatever Redis does (CPU µs per request)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bench.report import RESULTS_DIR, machine_info

RatioOp = Literal["≥", "≤", "≤+", "≤abs"]


@dataclass(slots=True, kw_only=True)
class Delivery:
    """Every expected message delivered? `missing` expected but never seen, `duplicates` seen more
    than once (counted, allowed: both systems deliver at least once), `unexpected` seen but never
    sent (a wrong answer)."""

    expected: int
    delivered: int
    missing: int = 0
    duplicates: int = 0
    unexpected: int = 0

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.unexpected == 0

    @classmethod
    def of(cls, expected: Iterable[object], seen: Sequence[object]) -> Delivery:
        wanted, unique = set(expected), set(seen)
        return cls(expected=len(wanted), delivered=len(seen), missing=len(wanted - unique),
                   duplicates=len(seen) - len(unique), unexpected=len(unique - wanted))

    def short(self) -> str:
        if self.ok:
            return "ok" if not self.duplicates else f"ok, {self.duplicates} dup"
        extra = f", {self.unexpected} unexpected" if self.unexpected else ""
        return f"MISSING {self.missing}/{self.expected}{extra}"


@dataclass(slots=True, kw_only=True)
class Side:
    """One system's number for one workload; `error` set when the run failed."""

    value: float = float("nan")
    delivery: Delivery | None = None
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and (self.delivery is None or self.delivery.ok)

    def as_json(self) -> dict[str, Any]:
        delivery = None
        if self.delivery is not None:
            d = self.delivery
            delivery = {"expected": d.expected, "delivered": d.delivered, "missing": d.missing,
                        "duplicates": d.duplicates, "unexpected": d.unexpected, "ok": d.ok}
        return {"value": self.value, "delivery": delivery, "error": self.error, "details": self.details}


@dataclass(slots=True, kw_only=True)
class Row:
    workload: str
    pairing: str
    unit: str
    rocketq: Side
    redis: Side
    target: tuple[RatioOp, float] | None = None
    note: str = ""

    @property
    def ratio(self) -> float:
        a, b = self.rocketq.value, self.redis.value
        if a != a or b != b or b == 0:
            return float("nan")
        return a / b

    @property
    def passed(self) -> bool | None:
        if self.target is None:
            return None
        op, bound = self.target
        a, b, ratio = self.rocketq.value, self.redis.value, self.ratio
        if op == "≤+":
            return a == a and b == b and a <= b + bound
        if op == "≤abs":
            return a == a and a <= bound
        if ratio != ratio:
            return False
        return ratio >= bound if op == "≥" else ratio <= bound

    @property
    def ok(self) -> bool:
        return self.rocketq.ok and self.redis.ok

    def as_json(self) -> dict[str, Any]:
        target = None if self.target is None else {"op": self.target[0], "value": self.target[1]}
        return {"workload": self.workload, "pairing": self.pairing, "unit": self.unit,
                "rocketq": self.rocketq.as_json(), "redis": self.redis.as_json(),
                "ratio_rocketq_over_redis": None if self.ratio != self.ratio else round(self.ratio, 4),
                "target": target, "passed": self.passed, "checks_ok": self.ok, "note": self.note}


def _value(value: float) -> str:
    if value != value:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _target(target: tuple[RatioOp, float] | None) -> str:
    if target is None:
        return "-"
    op, bound = target
    if op == "≤abs":
        return f"≤ {bound:g}"
    return f"≤ redis+{bound:g}" if op == "≤+" else f"{op} {bound:g}x"


def _check(row: Row) -> str:
    parts = []
    for name, side in (("rq", row.rocketq), ("redis", row.redis)):
        if side.error is not None:
            parts.append(f"{name} ERROR")
        elif side.delivery is not None:
            parts.append(f"{name} {side.delivery.short()}")
    return "; ".join(parts) or "-"


def format_table(rows: Sequence[Row]) -> str:
    header = ("workload", "pairing", "rocketq", "redis", "unit", "rq/redis", "target", "result", "delivery")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        passed = row.passed
        verdict = "-" if passed is None else ("PASS" if passed else "MISS")
        ratio = "n/a" if row.ratio != row.ratio else f"{row.ratio:.2f}"
        lines.append((row.workload, row.pairing, _value(row.rocketq.value), _value(row.redis.value), row.unit,
                      ratio, _target(row.target), verdict, _check(row)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = {2, 3, 5}
    out = []
    for index, line in enumerate(lines):
        cells = [cell.rjust(w) if i in right else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(line, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_json(rows: Sequence[Row], *, quick: bool, notes: Sequence[str], params: dict[str, Any],
               path: Path | None = None) -> Path:
    path = path or RESULTS_DIR / ("peers-quick.json" if quick else "peers.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"quick": quick, "machine": machine_info(), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "params": params, "notes": list(notes), "rows": [r.as_json() for r in rows],
            "targets_passed": sum(1 for r in rows if r.passed is True),
            "targets_missed": [f"{r.workload} [{r.pairing}]" for r in rows if r.passed is False],
            "checks_failed": [f"{r.workload} [{r.pairing}]" for r in rows if not r.ok]}
    path.write_text(json.dumps(body, indent=2, ensure_ascii=False, default=str) + "\n")
    return path
