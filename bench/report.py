"""Results: `Metric` rows, a plain-text table, and JSON files under `bench/results/`.

A target is `(op, bound)` with op "≥" or "≤"; a metric without one is informational ("-")."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from broker.host import cpu_idle

RESULTS_DIR = Path(__file__).resolve().parent / "results"
Op = Literal["≥", "≤"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Metric:
    name: str
    value: float
    unit: str
    target: tuple[Op, float] | None = None

    @property
    def passed(self) -> bool | None:
        """None without a target; NaN (not measured) fails."""
        if self.target is None:
            return None
        op, bound = self.target
        if self.value != self.value:
            return False
        return self.value >= bound if op == "≥" else self.value <= bound

    def as_json(self) -> dict[str, Any]:
        target = None if self.target is None else {"op": self.target[0], "value": self.target[1]}
        return {"name": self.name, "value": self.value, "unit": self.unit, "target": target,
                "passed": self.passed}


@dataclass(slots=True, kw_only=True)
class BenchResult:
    """One benchmark's outcome. `ok` is False when the benchmark itself failed (an exception or a
    failed correctness check), which is different from a missed target."""

    name: str
    metrics: list[Metric] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    ok: bool = True
    error: str | None = None
    elapsed_s: float = 0.0

    def add(self, name: str, value: float, unit: str, target: tuple[Op, float] | None = None) -> None:
        self.metrics.append(Metric(name=name, value=value, unit=unit, target=target))

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "error": self.error, "elapsed_s": round(self.elapsed_s, 3),
                "params": self.params, "notes": self.notes, "metrics": [m.as_json() for m in self.metrics],
                "details": self.details, "machine": machine_info(),
                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def machine_info() -> dict[str, Any]:
    memory = psutil.virtual_memory()
    freq = psutil.cpu_freq()
    return {"cpu_count": os.cpu_count(), "cpu_count_physical": psutil.cpu_count(logical=False),
            "cpu_mhz": round(freq.current) if freq else None, "memory_mb": memory.total // (1 << 20),
            "python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "platform": platform.platform(), "machine": platform.machine(), **cpu_idle_info()}


def cpu_idle_info() -> dict[str, Any]:
    """{"cpuidle_driver", "guest_halt_poll_ns", "halt_polling_in_effect"} of this machine
    (`broker.host.cpu_idle`; the parameter can exist with another driver, or none, in use): with the
    `haltpoll` driver at 0 ns every idle moment halts the vCPU, which doubled the CPU of one request
    awaited at a time on the development VM (docs/performance.md, "Per-request cost")."""
    state = cpu_idle()
    return {"cpuidle_driver": state.driver, "guest_halt_poll_ns": state.guest_halt_poll_ns,
            "halt_polling_in_effect": state.halt_polling_in_effect}


def cpu_idle_line() -> str:
    """One line for a benchmark's footer: the idle driver and its halt polling."""
    state = cpu_idle()
    line = f"cpu idle: driver {state.driver or 'unknown'}"
    if state.guest_halt_poll_ns is not None:
        line += f", guest_halt_poll_ns {state.guest_halt_poll_ns}"
        if not state.halt_polling_in_effect:
            line += " (not in effect: the haltpoll driver is not in use)"
    if state.halts_at_once:
        line += " (every idle moment halts the vCPU: the single-request rows pay for it)"
    return line


def _format_value(value: float) -> str:
    if value != value:
        return "n/a"
    if value == int(value) and abs(value) >= 100:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _format_target(target: tuple[Op, float] | None) -> str:
    return "-" if target is None else f"{target[0]} {_format_value(target[1])}"


def _format_pass(passed: bool | None) -> str:
    return "-" if passed is None else ("PASS" if passed else "FAIL")


def format_table(results: Sequence[BenchResult]) -> str:
    """One row per metric; a failed benchmark adds an ERROR row with its message."""
    rows: list[tuple[str, ...]] = [("name", "value", "unit", "target", "result")]
    for result in results:
        for m in result.metrics:
            rows.append((m.name, _format_value(m.value), m.unit, _format_target(m.target),
                         _format_pass(m.passed)))
        if not result.ok:
            rows.append((f"{result.name} (benchmark)", "ERROR", "", "", (result.error or "failed")[:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]),
                 *(cell.ljust(width) for cell, width in zip(row[2:], widths[2:], strict=True))]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_result(result: BenchResult, directory: Path = RESULTS_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.name}.json"
    path.write_text(json.dumps(result.as_json(), indent=2, ensure_ascii=False) + "\n")
    return path


def write_summary(results: Sequence[BenchResult], quick: bool, pinned: bool,
                  directory: Path = RESULTS_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    metrics = [m for r in results for m in r.metrics]
    summary = {
        "quick": quick, "pinned": pinned, "machine": machine_info(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "benchmarks": {r.name: {"ok": r.ok, "error": r.error, "elapsed_s": round(r.elapsed_s, 3),
                                "targets_missed": [m.name for m in r.metrics if m.passed is False]}
                       for r in results},
        "metrics": [m.as_json() for m in metrics],
        "targets_passed": sum(1 for m in metrics if m.passed is True),
        "targets_failed": sum(1 for m in metrics if m.passed is False),
    }
    path = directory / "summary.json"
    path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return path


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, int(fraction * len(sorted_values) + 0.999999) - 1))
    return sorted_values[rank]

