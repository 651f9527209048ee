"""What a processor knows about the request besides its command."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.channel import Channel


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One per connection, made on its first request and reused (the dispatcher keeps it in the
    channel's `attributes`): nothing in it is per request."""

    channel: Channel
    client_addr: str       # "ip:port" of the TCP peer (a message's born_host)
