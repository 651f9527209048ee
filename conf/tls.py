"""TLS settings (`[tls]` of the broker and the name server) and the `ssl.SSLContext`s built from them.

Modes, as RocketMQ's `tls.server.mode`: "disabled" (plaintext only), "permissive" (TLS and plaintext
on the same port: the first byte of a connection decides) and "enforcing" (TLS only; a plaintext
connection is closed). `require_client_cert` is mutual TLS: a client must present a certificate that
chains to `ca_file`. The contexts accept TLS 1.2 and 1.3 only.

    ctx = server_context(TlsConfig(mode="enforcing", cert_file="server.pem", key_file="server.key"))
    ctx = client_context(ca_file="ca.pem")      # verifies the server's certificate and host name
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Literal

from conf.ranges import Range, check_ranges

TlsMode = Literal["disabled", "permissive", "enforcing"]


class TlsError(OSError):
    """A certificate, key or CA file cannot be read or does not fit; the message names the file.
    An `OSError`, so a broker or name server that cannot start reports it in one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """TLS of the listening port, the metrics endpoint (HTTPS when on) and, on a broker, its own
    connections to name servers (TLS when on, presenting `cert_file` and verifying with `ca_file`).
    Raises `ValueError` when a mode that serves TLS lacks `cert_file` or `key_file`, or
    `require_client_cert` lacks `ca_file`. How to make certificates: [Security](security.md)."""

    RANGES: ClassVar[Mapping[str, Range]] = MappingProxyType({"handshake_timeout_ms": Range(low=1)})

    mode: TlsMode = "disabled"          # "permissive": TLS and plaintext on one port; "enforcing": TLS only
    cert_file: str = ""                 # PEM certificate chain of this server (its own certificate first)
    key_file: str = ""                  # PEM private key of cert_file (unencrypted)
    ca_file: str = ""                   # PEM CA certificates: client certificates must chain to them ("": system CAs)
    require_client_cert: bool = False   # mutual TLS: a client without a certificate signed by ca_file is refused
    handshake_timeout_ms: int = 10_000  # a new connection must send its first byte and finish the handshake in this

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES)
        if self.mode != "disabled" and not (self.cert_file and self.key_file):
            raise ValueError(f"tls.mode = {self.mode!r} needs tls.cert_file and tls.key_file")
        if self.require_client_cert and not self.ca_file:
            raise ValueError("tls.require_client_cert = true needs tls.ca_file (the CA client certificates chain to)")

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"


def server_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The server-side context of `config` (None when its mode is "disabled"): its certificate and
    key, `ca_file` trusted for client certificates, which are required when `require_client_cert`
    (and otherwise not asked for). Raises `TlsError` naming the file that cannot be loaded."""
    if not config.enabled:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, config.cert_file, config.key_file)
    if config.ca_file:
        _load_ca(context, config.ca_file)
    context.verify_mode = ssl.CERT_REQUIRED if config.require_client_cert else ssl.CERT_NONE
    return context


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "", verify: bool = True) -> ssl.SSLContext:
    """A client-side context: the server's certificate must chain to `ca_file` (the system's CAs
    when "") and name the host connected to (a DNS or IP subject alternative name); `cert_file` /
    `key_file` (key_file "" when the key is in cert_file) are presented when the server asks (mutual
    TLS). `verify=False` checks nothing (tests against self-signed servers only). Raises `TlsError`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca_file:
        _load_ca(context, ca_file)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert_file:
        _load_chain(context, cert_file, key_file)
    return context


def broker_client_context(config: TlsConfig) -> ssl.SSLContext | None:
    """What a broker uses for its own connections (name servers): TLS when `config` is on,
    presenting its own certificate (which then needs the clientAuth extended key usage, or none,
    where name servers require client certificates) and verifying with its `ca_file`."""
    if not config.enabled:
        return None
    return client_context(config.ca_file, config.cert_file, config.key_file)


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        context.load_cert_chain(cert_file, key_file or None)
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise TlsError(f"tls: cannot load the certificate {cert_file!r} with the key {key_file or cert_file!r}: "
                       f"{reason}") from None


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise TlsError(f"tls: cannot load the CA file {ca_file!r}: {reason}") from None
