"""The address a broker advertises (in every msg_id and to name servers)."""

from __future__ import annotations

import socket


def advertised_host(listen_host: str) -> str:
    """The listen host, or the first non-loopback IPv4 address when listening on all addresses."""
    if listen_host not in ("0.0.0.0", "", "::"):
        return listen_host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))   # TEST-NET: no packet is sent by a UDP connect
            host = str(s.getsockname()[0])
            if not host.startswith("127."):
                return host
    except OSError:
        pass
    return "127.0.0.1"
