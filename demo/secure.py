"""The flights demo with security on (`python -m demo --secure`, `make demo DEMO_SECURE=1`).

The broker runs with authentication and authorization on (`auth.*` settings) and an `init_user`,
a Super user `demo-admin` with a random password. Through the admin API (signed as that user)
the demo creates the topic and one Normal user per role, each with a random password and an ACL
that allows what the role needs and nothing else:

| user | ACL |
|---|---|
| the producer group's name (`flight-replay`) | `Pub` on `Topic:<topic>` |
| the consumer group's name (`flight-stats`) | `Sub` on `Topic:<topic>` and `Group:<group>` (its retry topic included) |

The producer and both push consumers then run with those credentials. TLS is not switched on by
the demo yet."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient
from protocol.bodies import AclEntryData
from protocol.signing import Credentials

ADMIN = "demo-admin"


@dataclass(frozen=True, slots=True)
class DemoUsers:
    """Who signs what: `admin` (Super: topic and users), `producer` and `consumer` (Normal)."""

    admin: Credentials
    producer: Credentials | None = None
    consumer: Credentials | None = None


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
                            consumer_group: str) -> DemoUsers:
    """The producer's and the consumer's users (named after their groups, random passwords) and
    their ACLs on the broker at `address`, created as `admin`. Raises the broker's `MQError`
    (`NoPermission` when `admin` is not a Super user there)."""
    producer = Credentials(producer_group, secrets.token_hex(16))
    consumer = Credentials(consumer_group, secrets.token_hex(16))
    producer_acl, consumer_acl = role_acls(topic, consumer_group)
    remoting = RemotingClient(credentials=admin)
    try:
        api = AdminAPI(remoting)
        for user, entries in ((producer, producer_acl), (consumer, consumer_acl)):
            await api.create_user(address, user.access_key, user.secret_key, "Normal")
            await api.create_acl(address, f"User:{user.access_key}", entries)
    finally:
        await remoting.close()
    return DemoUsers(admin, producer, consumer)


def describe(users: DemoUsers, topic: str, consumer_group: str) -> str:
    """One line for the console: who may do what (never a password)."""
    assert users.producer is not None and users.consumer is not None
    return (f"Authentication and authorization on: user [bold]{users.producer.access_key}[/bold] may Pub to "
            f"Topic:{topic}; user [bold]{users.consumer.access_key}[/bold] may Sub on Topic:{topic}, "
            f"Group:{consumer_group}")
