"""NOTIFY_CONSUMER_IDS_CHANGED: tell every member of a group that its membership changed, at most
once per window.

RocketMQ 4.9 (`Broker2Client.notifyConsumerIdsChanged`) sends one frame to every member on every
change, so n members joining cost n²/2 frames: 5,000 fake client ids heartbeating into one group
made the broker send 21.2 million of them. We coalesce deliberately: `IdsChangedNotifier` sends a
round at once for the first change of a group (a lone join is announced without delay), then opens
a window of `interval_ms` (`notify_consumer_ids_changed_interval_ms`, 500); changes during the
window are announced by one more round when it ends, to the members of that moment. So a group
gets at most one round per window, a burst of joins costs a few rounds, and the last change is
always announced. A member whose connection is not reading (its writes paused) is skipped: it
rebalances on its own schedule (every 20 s) as well."""

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
    __slots__ = ("changed", "timer")

    def __init__(self, timer: asyncio.TimerHandle) -> None:
        self.changed = False
        self.timer = timer


class IdsChangedNotifier:
    """`changed(group)`: O(1) per call; the round is sent to `channels_of(group)` as they are
    when it is sent. `interval_ms` <= 0 sends a round for every change (RocketMQ's behaviour).
    Event-loop thread only; `close()` drops the windows (at a broker stop)."""

    def __init__(self, channels_of: Callable[[str], Sequence[Channel]], interval_ms: int) -> None:
        self._channels_of, self._interval_ms = channels_of, interval_ms
        self._windows: dict[str, _Window] = {}
        self.rounds = 0          # rounds sent since start
        self.frames = 0          # frames sent since start

    def changed(self, group: str) -> None:
        """The members or subscriptions of `group` changed: announce it now or when its window ends."""
        window = self._windows.get(group)
        if window is not None:
            window.changed = True
            return
        self._send(group)

    def _send(self, group: str) -> None:
        self.rounds += 1
        self.frames += notify_consumer_ids_changed(group, self._channels_of(group))
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

    def close(self) -> None:
        """Cancel the open windows; changes still waiting for theirs are not announced."""
        for window in self._windows.values():
            window.timer.cancel()
        self._windows.clear()
