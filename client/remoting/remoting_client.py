"""`RemotingClient` lives in `protocol.remoting_client` (the broker and the name server use it too,
for their own outbound requests); re-exported here, where clients have always imported it."""

from protocol.remoting_client import InboundHandler, RemotingClient, split_address

__all__ = ["InboundHandler", "RemotingClient", "split_address"]
