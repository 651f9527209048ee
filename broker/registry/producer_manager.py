"""Producer groups → channels, kept by HEART_BEAT and dropped with their connection."""

from __future__ import annotations

from protocol.channel import Channel


class ProducerManager:
    def __init__(self) -> None:
        self._groups: dict[str, dict[Channel, tuple[str, int]]] = {}

    def register(self, group: str, channel: Channel, client_id: str, now_ms: int) -> None:
        self._groups.setdefault(group, {})[channel] = (client_id, now_ms)

    def unregister(self, group: str, channel: Channel) -> None:
        channels = self._groups.get(group)
        if channels is not None:
            channels.pop(channel, None)
            if not channels:
                del self._groups[group]

    def remove_channel(self, channel: Channel) -> None:
        for group in [g for g, chans in self._groups.items() if channel in chans]:
            self.unregister(group, channel)

    def channels_of(self, group: str) -> list[Channel]:
        """The connections of `group`'s producers (for a transaction check-back)."""
        return list(self._groups.get(group, ()))

    def expired_channels(self, now_ms: int, timeout_ms: int) -> list[Channel]:
        return [ch for chans in self._groups.values() for ch, (_, at) in chans.items()
                if now_ms - at > timeout_ms]

    def connection_counts(self) -> dict[str, int]:
        """producer group → open connections."""
        return {group: len(channels) for group, channels in self._groups.items()}

    def group_count(self) -> int:
        return len(self._groups)
