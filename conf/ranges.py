"""The numeric ranges config fields are checked against, as data: a config class lists its
`RANGES` and calls `check_ranges` from `__post_init__`; `conf.docgen` prints the same table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Range:
    """Inclusive bounds (`None`: unbounded on that side); `unset` is a value outside them that means
    "no limit" (RocketMQ's -1). `Range(1, 1024)`, `Range(low=0)`, `Range(1, 6_553_500, unset=-1)`."""

    low: int | None = None
    high: int | None = None
    unset: int | None = None

    def __contains__(self, value: float) -> bool:
        if self.unset is not None and value == self.unset:
            return True
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def describe(self) -> str:
        """`"[1, 1024]"`, `"≥ 0"`, `"≤ 10"`, `"-1 or [1, 6553500]"`."""
        if self.low is not None and self.high is not None:
            text = f"[{self.low}, {self.high}]"
        elif self.low is not None:
            text = f"≥ {self.low}"
        elif self.high is not None:
            text = f"≤ {self.high}"
        else:
            text = "any"
        return text if self.unset is None else f"{self.unset} or {text}"


def check_ranges(config: object, ranges: Mapping[str, Range]) -> None:
    """Raise `ValueError` naming the first field of `config` whose value is outside its range."""
    for name, allowed in ranges.items():
        value = getattr(config, name)
        if value not in allowed:
            raise ValueError(f"{name} = {value} is out of range (allowed: {allowed.describe()})")
