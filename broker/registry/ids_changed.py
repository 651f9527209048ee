"""NOTIFY_CONSUMER_IDS_CHANGED: tell every member of a group that its membership changed, a few
rounds per window at most.

RocketMQ 4.9 (`Broker2Client.notifyConsumerIdsChanged`) sends one frame to every member on every
change, so n members joining cost n²/2 frames: 5,000 fake client ids heartbeating into one group
made the broker send 21.2 million of them. We coalesce deliberately: `IdsChangedNotifier` sends a
round at once for the first change of a group and opens a window of `interval_ms`
(`notify_consumer_ids_changed_interval_ms`, 500); the changes that follow within it are announced
at once too up to `max_rounds` rounds in the window (`notify_consumer_ids_changed_max_rounds`, 4:
a group starting up - two consumers joining, its retry topic created - rebalances without delay,
as with RocketMQ), and any later ones by one more round when the window ends, to the members of
that moment (which opens the next window). So a group gets at most `max_rounds` rounds per window,
a burst of n joins costs a few rounds instead of n, and the last change is always announced. A
member whose connection is not reading (its writes paused) is skipped: it rebalances on its own
schedule (every 20 s) as well."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from protocol.channel import Channel
from protocol.codes import RequestCode
from protocol.command import request
from protocol.errors import MQError
from protocol.headers import NotifyConsumerIdsChangedRequestHeader

log = logging.getLogger(__name__)


def notify_consumer_ids_changed(group: str, channels: Sequence[Channel]) -> int:
    """One-way NOTIFY_CONSUMER_IDS_CHANGED {consumer_group} to each channel; a closed channel, or
    one whose writes are paused (its peer does not read), is skipped. Returns the frames sent."""
    sent = 0
    for channel in channels:
        if channel.closed or channel.write_paused:
            continue
        try:
            channel.invoke_oneway(request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                          NotifyConsumerIdsChangedRequestHeader(consumer_group=group)))
            sent += 1
        except MQError as exc:
            log.info("could not notify %s of group %s change: %s", channel, group, exc)
    return sent


class _Window:
    __slots__ = ("changed", "rounds", "timer")

    def __init__(self, timer: asyncio.TimerHandle) -> None:
        self.changed = False
        self.rounds = 1         # sent in this window
        self.timer = timer


class IdsChangedNotifier:
    """`changed(group)`: O(1) per call; the round is sent to `channels_of(group)` as they are
    when it is sent. `interval_ms` <= 0 sends a round for every change (RocketMQ's behaviour).
    Event-loop thread only; `close()` drops the windows (at a broker stop)."""

    def __init__(self, channels_of: Callable[[str], Sequence[Channel]], interval_ms: int, max_rounds: int = 4) -> None:
        self._channels_of, self._interval_ms, self._max_rounds = channels_of, interval_ms, max(max_rounds, 1)
        self._windows: dict[str, _Window] = {}
        self.rounds = 0          # rounds sent since start
        self.frames = 0          # frames sent since start

    def changed(self, group: str) -> None:
        """The members or subscriptions of `group` changed: announce it now or when its window ends."""
        window = self._windows.get(group)
        if window is None:
            self._send(group)
            self._open_window(group)
        elif window.rounds < self._max_rounds:
            window.rounds += 1
            self._send(group)
        else:
            window.changed = True

    def _send(self, group: str) -> None:
        self.rounds += 1
        self.frames += notify_consumer_ids_changed(group, self._channels_of(group))

    def _open_window(self, group: str) -> None:
        if self._interval_ms <= 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:        # no loop (a registry used on its own): nothing to coalesce with
            return
        self._windows[group] = _Window(loop.call_later(self._interval_ms / 1000, self._window_ended, group))

    def _window_ended(self, group: str) -> None:
        window = self._windows.pop(group, None)
        if window is not None and window.changed:
            self._send(group)
            self._open_window(group)

    def close(self) -> None:
        """Cancel the open windows; changes still waiting for theirs are not announced."""
        for window in self._windows.values():
            window.timer.cancel()
        self._windows.clear()
