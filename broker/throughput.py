"""`Throughput`: the broker's messages in and out per second, read off its running totals
(`BrokerMetrics.put_total` / `get_total`) when GET_BROKER_RUNTIME_INFO asks, the counterpart of
the put and get TPS RocketMQ's runtime info answers (`putTps`, `getTransferedTps`, from its
`BrokerStatsManager` samples). Off the request path: a send or pull only adds to a total; the
readings are taken when someone asks."""

from __future__ import annotations

from collections import deque

WINDOW_MS = 10_000          # rates cover at least the last 10 s (RocketMQ's first TPS figure: 10 s)
MIN_GAP_MS = 1_000          # at most one reading a second is kept


class Throughput:
    """Readings (at ms, put total, get total), bounded: at most one per `min_gap_ms`, and only the
    newest reading at least `window_ms` old plus those after it (≤ window/gap + 2). The first is
    (`started_at_ms`, 0, 0): the broker's start. Event-loop thread only."""

    def __init__(self, started_at_ms: int, window_ms: int = WINDOW_MS, min_gap_ms: int = MIN_GAP_MS) -> None:
        self._readings: deque[tuple[int, int, int]] = deque([(started_at_ms, 0, 0)])
        self.window_ms, self.min_gap_ms = window_ms, min_gap_ms

    def rates(self, now_ms: int, put_total: int, get_total: int) -> tuple[float, float]:
        """(messages put per second, messages got per second) since the newest reading at least
        `window_ms` before `now_ms` (or the oldest one kept: the broker's start), then keeps this
        reading. (0.0, 0.0) when no time has passed, or when a total went back (the counters
        restarted: the readings start again from this one)."""
        readings = self._readings
        if put_total < readings[-1][1] or get_total < readings[-1][2]:      # counters restarted
            readings.clear()
            readings.append((now_ms, put_total, get_total))
            return 0.0, 0.0
        while len(readings) >= 2 and now_ms - readings[1][0] >= self.window_ms:
            readings.popleft()
        since_ms, put_before, get_before = readings[0]
        if now_ms - readings[-1][0] >= self.min_gap_ms:
            readings.append((now_ms, put_total, get_total))
        elapsed_ms = now_ms - since_ms
        if elapsed_ms <= 0:
            return 0.0, 0.0
        return (put_total - put_before) * 1000 / elapsed_ms, (get_total - get_before) * 1000 / elapsed_ms

    def __len__(self) -> int:
        return len(self._readings)
