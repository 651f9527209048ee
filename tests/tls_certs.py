"""The tests' certificates: `conf.devcerts` (a CA, server and client certificates made fresh with
`cryptography`, never committed), under the names the tests import."""

from __future__ import annotations

from conf.devcerts import CertFiles, make_certs, server_tls

__all__ = ["CertFiles", "make_certs", "server_tls"]
