"""`FailureLimiter`: authentication failures per peer address, so a password guesser (or a
misconfigured client hammering away) is refused unchecked once it has failed too often."""

from __future__ import annotations


class FailureLimiter:
    """At most `max_failures` failures per address in a fixed window of `window_ms` starting at
    its first failure; past that, `retry_after_ms` is positive until the window ends. Remembers at
    most `max_addresses` addresses: past it the one that failed least recently is forgotten, so a
    flood from many addresses costs bounded memory (and forgets, rather than blocks, the oldest).

    Every client behind one address shares its budget: a misconfigured client can get the
    correctly configured ones on the same host refused for up to a window."""

    def __init__(self, max_failures: int, window_ms: int, max_addresses: int = 65_536) -> None:
        if max_failures < 1 or window_ms < 1 or max_addresses < 1:
            raise ValueError("max_failures, window_ms and max_addresses must be positive")
        self.max_failures, self.window_ms, self.max_addresses = max_failures, window_ms, max_addresses
        self.windows: dict[str, tuple[int, int]] = {}     # address -> (window start ms, failures), oldest first

    def __len__(self) -> int:
        return len(self.windows)

    def retry_after_ms(self, address: str, now_ms: int) -> int:
        """0 when `address` may be checked; else the ms until its window ends."""
        windows = self.windows
        if not windows:
            return 0
        window = windows.get(address)
        if window is None or window[1] < self.max_failures:
            return 0
        left = window[0] + self.window_ms - now_ms
        if left <= 0:
            del windows[address]
            return 0
        return left

    def failed(self, address: str, now_ms: int) -> None:
        """Count one failure of `address` at `now_ms`."""
        windows = self.windows
        window = windows.pop(address, None)
        if window is None or now_ms - window[0] >= self.window_ms:
            window = (now_ms, 0)
        windows[address] = (window[0], window[1] + 1)       # (re)inserted last: the most recent
        while len(windows) > self.max_addresses:
            del windows[next(iter(windows))]
