"""Protected mode, as Redis's: a broker or name server with authentication off that listens on
anything but loopback serves loopback peers only; others get one NO_PERMISSION frame (opaque 0,
response flag) whose remark says what to do, and are closed. `protected_mode = false` (or the
start commands' `--insecure`) turns it off. Pure: the servers write the frame."""

from __future__ import annotations

import ipaddress

from conf.auth import AuthConfig


def is_loopback(host: str) -> bool:
    """True for a loopback IP (127.0.0.0/8, ::1, an IPv4-mapped 127.x) or "localhost"; False for
    "", "0.0.0.0", "::", any other address or host name."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def protected(listen_host: str, protected_mode: bool, auth: AuthConfig) -> bool:
    """Whether only loopback peers may connect: protected mode on, authentication off (neither
    switch of `auth`), and `listen_host` not a loopback address."""
    return protected_mode and not (auth.authentication_enabled or auth.authorization_enabled) \
        and not is_loopback(listen_host)


def refusal_remark(server: str, listen_host: str) -> str:
    """The remark of the frame a non-loopback peer gets from a protected `server` ("broker",
    "name server")."""
    return (f"connection refused: this {server} is in protected mode: authentication is off and it listens on "
            f"{listen_host or 'every address'}, so only loopback clients may connect. Either enable "
            f"authentication (auth.authentication_enabled = true, with an auth.init_user), or listen on "
            f"127.0.0.1, or start it with --insecure (protected_mode = false) if the network is trusted")
