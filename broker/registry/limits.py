"""Bounds on who may register by HEART_BEAT: members per consumer group and client ids per host.

RocketMQ 4.9 has neither: 5,000 fake client ids heartbeating into one group made every join slower
(O(n) per join), every member's rebalance hopeless (the real consumer got 0 of 1,040 messages) and
sends wait seconds. Here a heartbeat that would add a member past `max_consumers_per_group`
(1,000), or a client id past `max_client_ids_per_address` (100 distinct ids connected from one
host), is answered SYSTEM_BUSY with a remark naming the bound; nothing already registered is
touched, and the client retries at its next heartbeat (every 30 s). 0 turns a bound off."""

from __future__ import annotations

from collections.abc import Callable

from protocol.channel import Channel
from protocol.errors import SystemBusy


class ConsumerGroupFull(SystemBusy):
    def __init__(self, group: str, members: int, limit: int) -> None:
        super().__init__(f"consumer group {group!r} already has {members} members; this broker takes at "
                         f"most {limit} per group (max_consumers_per_group)")
        self.group, self.limit = group, limit


class TooManyClientIds(SystemBusy):
    def __init__(self, host: str, client_ids: int, limit: int) -> None:
        super().__init__(f"{client_ids} client ids are already connected from {host}; this broker takes at "
                         f"most {limit} per address (max_client_ids_per_address)")
        self.host, self.limit = host, limit


def host_of(channel: Channel) -> str:
    """The peer's IP address ("ip:port" without the port; IPv6 too)."""
    return channel.remote_address.rpartition(":")[0]


class ClientIdTable:
    """The client id each channel heartbeated with, counted per peer host. `admit` is O(1); a
    channel is forgotten by `remove_channel` when it closes. Event-loop thread only."""

    def __init__(self, max_per_address: int) -> None:
        self._max = max_per_address
        self._by_host: dict[str, dict[str, int]] = {}          # host → client id → channels
        self._of_channel: dict[Channel, tuple[str, str]] = {}  # channel → (host, client id)
        # called with (the channel's "ip:port", client id) when a channel starts heartbeating as a
        # client id (the message trace's CLIENT records)
        self.on_admit: Callable[[str, str], None] | None = None

    def client_ids(self, host: str) -> int:
        """Distinct client ids connected from `host`."""
        return len(self._by_host.get(host, ()))

    def admit(self, channel: Channel, client_id: str) -> None:
        """Record that `channel` heartbeats as `client_id`; raises `TooManyClientIds` (recording
        nothing) when that would be one distinct id too many for its host."""
        known = self._of_channel.get(channel)
        if known is not None and known[1] == client_id:
            return
        host = host_of(channel) if known is None else known[0]
        ids = self._by_host.get(host)
        if ids is None:
            ids = self._by_host[host] = {}
        if client_id not in ids and self._max > 0:
            leaving = known is not None and ids.get(known[1]) == 1    # its old id goes with the change
            if len(ids) - leaving >= self._max:
                if not ids:
                    del self._by_host[host]
                raise TooManyClientIds(host, len(ids), self._max)
        if known is not None:
            self.remove_channel(channel)
            ids = self._by_host.setdefault(host, {})
        ids[client_id] = ids.get(client_id, 0) + 1
        self._of_channel[channel] = (host, client_id)
        if self.on_admit is not None:
            self.on_admit(channel.remote_address, client_id)

    def remove_channel(self, channel: Channel) -> None:
        known = self._of_channel.pop(channel, None)
        if known is None:
            return
        host, client_id = known
        ids = self._by_host[host]
        if ids[client_id] > 1:
            ids[client_id] -= 1
            return
        del ids[client_id]
        if not ids:
            del self._by_host[host]
