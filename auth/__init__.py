"""Users, ACLs and request authentication shared by the broker and the name server (pure: no
asyncio, no broker or name-server imports). `protocol.signing` holds the wire side."""
