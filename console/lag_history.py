"""The console's lag history: per consumer group a bounded ring of (epoch ms, total lag) samples,
and the SVG line chart of the last hour drawn from them (server-side, no JavaScript needed).

Bounded twice: `max_points` samples per group (older ones fall off) and `max_groups` groups (the
least recently sampled group is forgotten). Nothing here does I/O; `console.sampler` feeds it."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from html import escape

Sample = tuple[int, int]
"""(sampled_at_ms epoch ms, total lag in messages)."""

HOUR_MS = 3_600_000


class LagHistory:
    """`record(group, at_ms, lag)` and `samples(group, since_ms)`; raises `ValueError` for
    `max_points` or `max_groups` below 1. Samples of a group are kept in the order recorded."""

    def __init__(self, *, max_points: int = 720, max_groups: int = 1_000) -> None:
        if max_points < 1 or max_groups < 1:
            raise ValueError("max_points and max_groups must be at least 1")
        self.max_points, self.max_groups = max_points, max_groups
        self._rings: OrderedDict[str, deque[Sample]] = OrderedDict()

    def record(self, group: str, at_ms: int, lag: int) -> None:
        ring = self._rings.get(group)
        if ring is None:
            ring = self._rings[group] = deque(maxlen=self.max_points)
            while len(self._rings) > self.max_groups:
                self._rings.popitem(last=False)
        else:
            self._rings.move_to_end(group)
        ring.append((at_ms, max(0, lag)))

    def samples(self, group: str, since_ms: int = 0) -> list[Sample]:
        """The group's samples taken at or after `since_ms`, oldest first ([] for an unknown group)."""
        return [s for s in self._rings.get(group, ()) if s[0] >= since_ms]

    def groups(self) -> list[str]:
        return list(self._rings)


def lag_chart_svg(samples: Sequence[Sample], now_ms: int, *, width: int = 600, height: int = 160,
                  span_ms: int = HOUR_MS) -> str:
    """An SVG polyline of `samples` over the `span_ms` before `now_ms` (x: time, y: lag, 0 at the
    bottom, the top labelled with the highest lag). Samples outside the span are left out; with
    none, a chart that says "no samples yet". Pure; the output is valid standalone SVG markup."""
    pad = 30
    inside = [(at, lag) for at, lag in samples if now_ms - span_ms <= at <= now_ms]
    top = max((lag for _, lag in inside), default=0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="lag over the last hour">',
             f'<rect x="{pad}" y="5" width="{width - pad - 5}" height="{height - pad}" class="chart-frame"/>',
             f'<text x="2" y="15" class="chart-label">{escape(str(top))}</text>',
             f'<text x="2" y="{height - pad + 5}" class="chart-label">0</text>',
             f'<text x="{pad}" y="{height - 8}" class="chart-label">-{span_ms // 60_000} min</text>',
             f'<text x="{width - 30}" y="{height - 8}" class="chart-label">now</text>']
    if not inside:
        parts.append(f'<text x="{width // 2 - 50}" y="{height // 2}" class="chart-label">no samples yet</text>')
    else:
        plot_w, plot_h = width - pad - 5, height - pad
        points = " ".join(
            f"{pad + plot_w * (at - (now_ms - span_ms)) / span_ms:.1f},"
            f"{5 + plot_h - (plot_h * lag / top if top else 0):.1f}" for at, lag in inside)
        parts.append(f'<polyline points="{points}" class="chart-line" fill="none"/>')
        last_x, last_y = points.rsplit(" ", 1)[-1].split(",")
        parts.append(f'<circle cx="{last_x}" cy="{last_y}" r="3" class="chart-dot"/>')     # also 1 sample
    parts.append("</svg>")
    return "".join(parts)
