"""The flights demo with security on (`python -m demo --secure`, `make demo DEMO_SECURE=1`).

The broker runs with authentication and authorization on (`auth.*` settings) and an `init_user`,
a Super user `demo-admin` with a random password. Through the admin API (signed as that user)
the demo creates the topic and one Normal user per role, each with a random password and an ACL
that allows what the role needs and nothing else:

| user | ACL |
|---|---|
| the producer group's name (`flight-replay`) | `Pub` on `Topic:<topic>` |
| the consumer group's name (`flight-stats`) | `Sub` on `Topic:<topic>` and `Group:<group>` (its retry topic included) |

The producer and both push consumers then run with those credentials.

TLS is on too when the demo starts the broker: a CA, a server certificate (127.0.0.1, localhost)
and a client certificate are made at start (`conf.devcerts`, with `cryptography`) in the run's
directory, the broker enforces TLS and requires client certificates (mutual TLS), and every client
(the admin API, the producer, the consumers) connects with the client certificate. On a broker of
yours (`--endpoint`), `--ca-file` connects over TLS, verifying the broker against that CA."""

from __future__ import annotations

import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path

from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient
from conf.tls import client_context
from protocol.bodies import AclEntryData
from protocol.signing import Credentials

ADMIN = "demo-admin"


@dataclass(frozen=True, slots=True)
class DemoUsers:
    """Who signs what: `admin` (Super: topic and users), `producer` and `consumer` (Normal)."""

    admin: Credentials
    producer: Credentials | None = None
    consumer: Credentials | None = None
    ssl_context: ssl.SSLContext | None = None     # every client's TLS (None: plaintext)


@dataclass(frozen=True, slots=True)
class DemoTls:
    """The run's certificates (PEM paths): the broker's `--set` values and the clients' context."""

    directory: Path
    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    def broker_settings(self, *, mutual: bool = True) -> dict[str, str]:
        """TLS enforcing, with client certificates required when `mutual`."""
        return {"tls.mode": "enforcing", "tls.cert_file": self.server_cert, "tls.key_file": self.server_key,
                "tls.ca_file": self.ca_file, "tls.require_client_cert": str(mutual).lower()}

    def client_context(self) -> ssl.SSLContext:
        """Verifies the broker against the run's CA and presents the client certificate."""
        return client_context(self.ca_file, self.client_cert, self.client_key)


def make_tls(directory: Path) -> DemoTls:
    """A fresh CA, server and client certificate in `directory` (`conf.devcerts`); raises
    `RuntimeError` when the `cryptography` package is missing."""
    try:
        from conf.devcerts import make_certs
    except ImportError as exc:
        raise RuntimeError("the secure demo makes its TLS certificates with the cryptography package "
                           "(pip install cryptography, or make install)") from exc
    certs = make_certs(directory, untrusted=False, prefix="rocketq demo")
    return DemoTls(directory, certs.ca_file, certs.server_cert, certs.server_key, certs.client_cert, certs.client_key)


def new_admin() -> Credentials:
    """The Super user a secured demo broker is started with (a random 32-hex-digit password)."""
    return Credentials(ADMIN, secrets.token_hex(16))


def broker_settings(admin: Credentials) -> dict[str, str]:
    """`--set` values of a broker with authentication and authorization on and `admin` as its
    `init_user` (created at first start)."""
    return {"auth.authentication_enabled": "true", "auth.authorization_enabled": "true",
            "auth.init_user": f"{admin.access_key}:{admin.secret_key}"}


def role_acls(topic: str, consumer_group: str) -> tuple[list[AclEntryData], list[AclEntryData]]:
    """(the producer's entries, the consumer's entries): see the module's table."""
    producer = [AclEntryData(resource=f"Topic:{topic}", actions=["Pub"])]
    consumer = [AclEntryData(resource=resource, actions=["Sub"]) for resource in (f"Topic:{topic}",
                                                                                 f"Group:{consumer_group}")]
    return producer, consumer


async def create_role_users(address: str, admin: Credentials, topic: str, producer_group: str,
                            consumer_group: str, ssl_context: ssl.SSLContext | None = None) -> DemoUsers:
    """The producer's and the consumer's users (named after their groups, random passwords) and
    their ACLs on the broker at `address`, created as `admin` (over TLS with `ssl_context`). Raises
    the broker's `MQError` (`NoPermission` when `admin` is not a Super user there)."""
    producer = Credentials(producer_group, secrets.token_hex(16))
    consumer = Credentials(consumer_group, secrets.token_hex(16))
    producer_acl, consumer_acl = role_acls(topic, consumer_group)
    remoting = RemotingClient(credentials=admin, ssl_context=ssl_context)
    try:
        api = AdminAPI(remoting)
        for user, entries in ((producer, producer_acl), (consumer, consumer_acl)):
            await api.create_user(address, user.access_key, user.secret_key, "Normal")
            await api.create_acl(address, f"User:{user.access_key}", entries)
    finally:
        await remoting.close()
    return DemoUsers(admin, producer, consumer, ssl_context)


def describe(users: DemoUsers, topic: str, consumer_group: str) -> str:
    """One line for the console: who may do what (never a password)."""
    assert users.producer is not None and users.consumer is not None
    return (f"Authentication and authorization on: user [bold]{users.producer.access_key}[/bold] may Pub to "
            f"Topic:{topic}; user [bold]{users.consumer.access_key}[/bold] may Sub on Topic:{topic}, "
            f"Group:{consumer_group}")
