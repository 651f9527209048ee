"""Capped exponential backoff for client retries (reconnects, failed pulls, lock attempts).

Pure code: the caller counts failures and sleeps; randomness comes in as a `random.Random`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ExponentialBackoff"]


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """Delay after the n-th consecutive failure: `base_ms * 2**(n-1)`, capped at `cap_ms`; 0 after none.
    With base 100 and cap 1000: 0, 100, 200, 400, 800, 1000, 1000, ... Raises `ValueError` on a
    negative `base_ms` or `cap_ms`."""

    base_ms: int
    cap_ms: int

    def __post_init__(self) -> None:
        if self.base_ms < 0 or self.cap_ms < 0:
            raise ValueError(f"backoff needs base_ms >= 0 and cap_ms >= 0, got {self.base_ms}, {self.cap_ms}")

    def delay_ms(self, failures: int) -> int:
        """The delay in ms after `failures` consecutive failures; `ValueError` if `failures` < 0."""
        if failures < 0:
            raise ValueError(f"failures must be >= 0, got {failures}")
        if failures == 0 or self.base_ms == 0:
            return 0
        if failures - 1 >= self.cap_ms.bit_length():    # 2**(failures-1) > cap_ms >= cap/base
            return self.cap_ms
        return min(self.base_ms << (failures - 1), self.cap_ms)

    def jittered_delay_ms(self, failures: int, rng: random.Random) -> int:
        """`delay_ms(failures)` with "equal jitter": uniform in [d - d // 2, d], so retries of many
        clients spread out but never wait less than half the plain delay."""
        delay = self.delay_ms(failures)
        return rng.randint(delay - delay // 2, delay)
