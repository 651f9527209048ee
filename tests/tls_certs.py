"""Test certificates, made fresh with `cryptography` (never committed): a CA, a server certificate for
127.0.0.1 and localhost (IP and DNS subject alternative names; server and client authentication,
so a broker can present it to a name server that requires client certificates), a client
certificate, and a client certificate from another CA that the servers do not trust."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conf.tls import TlsConfig, TlsMode

_VALID = datetime.timedelta(days=2)


@dataclass(frozen=True, slots=True)
class CertFiles:
    """PEM file paths (as `str`, as `[tls]` takes them)."""

    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    rogue_cert: str         # a client certificate signed by a CA the servers do not trust
    rogue_key: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> str:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
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


def _leaf(common_name: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, *,
          server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server \
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_certs(directory: Path) -> CertFiles:
    """Write the CA, server, client and untrusted-client files into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("rocketq test CA")
    server, server_key = _leaf("rocketq test server", ca, ca_key, server=True)
    client, client_key = _leaf("rocketq test client", ca, ca_key, server=False)
    rogue_ca, rogue_ca_key = _ca("untrusted CA")
    rogue, rogue_key = _leaf("untrusted client", rogue_ca, rogue_ca_key, server=False)
    return CertFiles(
        ca_file=_write_cert(ca, directory / "ca.pem"),
        server_cert=_write_cert(server, directory / "server.pem"),
        server_key=_write_key(server_key, directory / "server.key"),
        client_cert=_write_cert(client, directory / "client.pem"),
        client_key=_write_key(client_key, directory / "client.key"),
        rogue_cert=_write_cert(rogue, directory / "rogue.pem"),
        rogue_key=_write_key(rogue_key, directory / "rogue.key"))


def server_tls(certs: CertFiles, mode: TlsMode = "enforcing", *, require_client_cert: bool = False,
               handshake_timeout_ms: int = 10_000) -> TlsConfig:
    """A `[tls]` for a test broker or name server with the test server certificate and CA."""
    return TlsConfig(mode=mode, cert_file=certs.server_cert, key_file=certs.server_key, ca_file=certs.ca_file,
                     require_client_cert=require_client_cert, handshake_timeout_ms=handshake_timeout_ms)
