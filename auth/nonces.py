"""`NonceCache`: the nonces seen within the clock-skew window, bounded in memory.

A signed request is accepted once: its nonce is remembered for as long as its timestamp could
still pass the clock-skew check, so a replayed frame (valid when first sent) is refused. At a
high request rate the window could hold millions of nonces; past `max_entries` the oldest second
of them is forgotten and every timestamp up to that second is refused from then on (`floor_ms`),
so the cache never forgets a nonce whose frame could still be accepted: under that load the
accepted clock skew shrinks, the replay protection does not.

`nonce_cache` gives the C `auth._checks.NonceCache` when it was built (the same rules and
attributes; ~5x fewer instructions a check), else this module's `NonceCache`, its twin."""

from __future__ import annotations

from collections import deque
from typing import Protocol

from protocol.native import load

_NATIVE = load("auth._checks")


class Nonces(Protocol):
    """What both `NonceCache`s offer."""

    @property
    def window_ms(self) -> int: ...
    @property
    def max_entries(self) -> int: ...
    @property
    def floor_ms(self) -> int: ...
    def __len__(self) -> int: ...
    def check(self, nonce: str, timestamp_ms: int, now_ms: int) -> str | None: ...


def nonce_cache(window_ms: int, max_entries: int = 262_144) -> Nonces:
    """A `NonceCache(window_ms, max_entries)`: the C one when built, else the twin below. Raises
    `ValueError` as `NonceCache` (the C one also `OverflowError` for a `window_ms` beyond 2**60)."""
    if _NATIVE is not None:
        cache: Nonces = _NATIVE.NonceCache(window_ms, max_entries)
        return cache
    return NonceCache(window_ms, max_entries)


class NonceCache:
    """`check(nonce, timestamp_ms, now_ms)` → None when accepted (and remembered), else why not
    ("expired", "replayed"). Timestamps more than `window_ms` from `now_ms` (either side) are
    "expired"; `max_entries` ≥ 1 bounds the nonces held (~100 bytes each)."""

    def __init__(self, window_ms: int, max_entries: int = 262_144) -> None:
        if window_ms < 0 or max_entries < 1:
            raise ValueError("window_ms must be ≥ 0 and max_entries ≥ 1")
        self.window_ms = window_ms
        self.max_entries = max_entries
        self.floor_ms = -1                              # timestamps ≤ this are refused (forgotten nonces)
        self._seconds: deque[int] = deque()             # the buckets, oldest first (timestamp // 1000)
        self._buckets: dict[int, list[str]] = {}        # second -> the nonces accepted with it
        self._seen: dict[str, int] = {}                 # nonce -> its second

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, nonce: str, timestamp_ms: int, now_ms: int) -> str | None:
        window_ms = self.window_ms
        if abs(now_ms - timestamp_ms) > window_ms or timestamp_ms <= self.floor_ms:
            return "expired"
        seconds = self._seconds
        if seconds and seconds[0] < (now_ms - window_ms) // 1000:     # (`_expire`'s test, inline)
            self._expire(now_ms)
        if nonce in self._seen:
            return "replayed"
        second = timestamp_ms // 1000
        bucket = self._buckets.get(second)
        if bucket is None:
            bucket = self._buckets[second] = []
            if self._seconds and second < self._seconds[-1]:
                self._seconds.append(second)
                self._seconds = deque(sorted(self._seconds))
            else:
                self._seconds.append(second)
        bucket.append(nonce)
        self._seen[nonce] = second
        while len(self._seen) > self.max_entries:
            self._forget_oldest()
        return None

    def _expire(self, now_ms: int) -> None:
        """Drop buckets whose every timestamp is already outside the window."""
        oldest_allowed = (now_ms - self.window_ms) // 1000
        while self._seconds and self._seconds[0] < oldest_allowed:
            self._forget_oldest(raise_floor=False)

    def _forget_oldest(self, raise_floor: bool = True) -> None:
        second = self._seconds.popleft()
        seen = self._seen
        for nonce in self._buckets.pop(second):
            del seen[nonce]
        if raise_floor:
            self.floor_ms = max(self.floor_ms, second * 1000 + 999)
