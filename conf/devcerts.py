"""Throwaway certificates for tests and demos, made fresh with `cryptography` (never committed; a
dev dependency, so import this module only where it is installed): a CA, a server certificate for
the given hosts (IP and DNS subject alternative names; server and client authentication, so a
broker can present it to a name server that requires client certificates), a client certificate,
and optionally a client certificate from another CA that the servers do not trust.

    certs = make_certs(Path("tls"))                       # tls/ca.pem, server.pem, server.key, ...
    broker_tls = server_tls(certs, "enforcing", require_client_cert=True)
    context = conf.tls.client_context(certs.ca_file, certs.client_cert, certs.client_key)

Keys are unencrypted PEM written with mode 0600; certificates are valid for two days."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conf.tls import TlsConfig, TlsMode

_VALID = datetime.timedelta(days=2)
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True, slots=True)
class CertFiles:
    """PEM file paths (as `str`, as `[tls]` takes them)."""

    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    rogue_cert: str = ""    # a client certificate signed by a CA the servers do not trust ("": not made)
    rogue_key: str = ""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> str:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, 0o600)       # an existing file keeps its mode through O_CREAT
    return str(path)


def _write_cert(cert: x509.Certificate, path: Path) -> str:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _leaf(common_name: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, *,
          hosts: Sequence[str] = ()) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for `hosts` when given, else a client certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if hosts \
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_certs(directory: Path, *, hosts: Sequence[str] = DEFAULT_HOSTS, untrusted: bool = True,
               prefix: str = "rocketq test") -> CertFiles:
    """Write ca.pem, server.pem/.key (for `hosts`), client.pem/.key and, with `untrusted`,
    rogue.pem/.key (a client certificate of another CA) into `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca(f"{prefix} CA")
    server, server_key = _leaf(f"{prefix} server", ca, ca_key, hosts=hosts)
    client, client_key = _leaf(f"{prefix} client", ca, ca_key)
    rogue_cert = rogue_key = ""
    if untrusted:
        rogue_ca, rogue_ca_key = _ca("untrusted CA")
        rogue, rogue_private = _leaf("untrusted client", rogue_ca, rogue_ca_key)
        rogue_cert = _write_cert(rogue, directory / "rogue.pem")
        rogue_key = _write_key(rogue_private, directory / "rogue.key")
    return CertFiles(
        ca_file=_write_cert(ca, directory / "ca.pem"),
        server_cert=_write_cert(server, directory / "server.pem"),
        server_key=_write_key(server_key, directory / "server.key"),
        client_cert=_write_cert(client, directory / "client.pem"),
        client_key=_write_key(client_key, directory / "client.key"),
        rogue_cert=rogue_cert, rogue_key=rogue_key)


def server_tls(certs: CertFiles, mode: TlsMode = "enforcing", *, require_client_cert: bool = False,
               handshake_timeout_ms: int = 10_000) -> TlsConfig:
    """A `[tls]` for a broker or name server with the server certificate and CA of `certs`."""
    return TlsConfig(mode=mode, cert_file=certs.server_cert, key_file=certs.server_key, ca_file=certs.ca_file,
                     require_client_cert=require_client_cert, handshake_timeout_ms=handshake_timeout_ms)

