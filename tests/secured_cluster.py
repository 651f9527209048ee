"""A cluster with everything on, in this process over TCP: a name server and brokers with
authentication, authorization and TLS (enforcing) on, each broker registering over TLS signed as
an inner user the name server allows `Update` on `Cluster`; users created on every server at once.
For tests/test_all_secured.py."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from broker.broker import Broker
from client.admin_api import AdminAPI
from client.remoting.remoting_client import RemotingClient
from conf.devcerts import CertFiles, server_tls
from conf.namesrv import NamesrvConfig
from conf.tls import client_context
from namesrv.namesrv import NameServer
from protocol.bodies import AclEntryData
from protocol.signing import Credentials
from tests.conftest import broker_config
from tests.helpers import wait_until
from tests.security_helpers import ADMIN, SECURED

INNER = Credentials("broker-inner", "inner-secret")
CLUSTER = "SecureCluster"
# lenient: the tests refuse on purpose, all from 127.0.0.1, and must not lock the admin out
AUTH = replace(SECURED, max_failures_per_address=1_000_000)
Allow = Sequence[tuple[str, Sequence[str]]]


@dataclass(frozen=True, slots=True)
class SecuredCluster:
    namesrv: NameServer
    brokers: list[Broker]
    certs: CertFiles

    @property
    def endpoint(self) -> str:
        return self.namesrv.address

    @property
    def addresses(self) -> list[str]:
        """The name server's address, then each broker's."""
        return [self.namesrv.address, *(b.address for b in self.brokers)]

    def context(self) -> ssl.SSLContext:
        """A client context trusting the cluster's CA (no client certificate: server-only TLS)."""
        return client_context(self.certs.ca_file)

    @asynccontextmanager
    async def admin(self, credentials: Credentials = ADMIN) -> AsyncIterator[AdminAPI]:
        """An `AdminAPI` over TLS signing as `credentials` (the Super user by default)."""
        remoting = RemotingClient(credentials=credentials, ssl_context=self.context())
        try:
            yield AdminAPI(remoting)
        finally:
            await remoting.close()

    async def add_user(self, name: str, password: str, allow: Allow, addresses: Sequence[str] = ()) -> Credentials:
        """A Normal user whose ACL allows each (resource, actions) of `allow`, on every server of
        `addresses` (default: the name server and every broker); its credentials."""
        entries = [AclEntryData(resource=resource, actions=list(actions)) for resource, actions in allow]
        async with self.admin() as api:
            for address in addresses or self.addresses:
                await api.create_user(address, name, password, "Normal")
                await api.create_acl(address, f"User:{name}", entries)
        return Credentials(name, password)

    async def create_topic(self, topic: str, queues: int, brokers: Sequence[Broker] = ()) -> None:
        """`topic` with `queues` queues on `brokers` (default: every broker); waits until the name
        server routes it to each of them (a broker registers a new topic at once)."""
        targets = list(brokers or self.brokers)
        async with self.admin() as api:
            for broker in targets:
                await api.create_topic(broker.address, topic, queue_nums=queues)
        names = {b.config.broker_name for b in targets}
        await wait_until(lambda: names <= self.routed_brokers(topic), 10, f"{topic} routed to {sorted(names)}")

    def routed_brokers(self, topic: str) -> set[str]:
        """The broker names the name server routes `topic` to."""
        return set(self.namesrv.routes.topic_queue_table.get(topic, {}))


@asynccontextmanager
async def secured_cluster(tmp_path: Path, certs: CertFiles, *, brokers: int = 2) -> AsyncIterator[SecuredCluster]:
    """A name server and `brokers` brokers (broker-a, broker-b, ... of `CLUSTER`), all enforcing
    TLS with `certs` and with authentication and authorization on (Super user `ADMIN`); returns once
    every broker has registered (signed as `INNER`, over TLS)."""
    tls = server_tls(certs, "enforcing")
    async with AsyncExitStack() as stack:
        namesrv = await stack.enter_async_context(NameServer(NamesrvConfig(
            listen_port=0, config_dir=str(tmp_path / "namesrv"), auth=AUTH, tls=tls)))
        cluster = SecuredCluster(namesrv, [], certs)
        await cluster.add_user(INNER.access_key, INNER.secret_key, [("Cluster", ["Update"])], [namesrv.address])
        inner = replace(AUTH, inner_credentials=f"{INNER.access_key}:{INNER.secret_key}")
        for i in range(brokers):
            name = f"broker-{chr(ord('a') + i)}"
            cluster.brokers.append(await stack.enter_async_context(Broker(broker_config(
                tmp_path / name, broker_name=name, cluster_name=CLUSTER, namesrv_addr=namesrv.address,
                auth=inner, tls=tls, auto_create_topic=False))))
        names = {b.config.broker_name for b in cluster.brokers}
        await wait_until(lambda: names <= set(namesrv.routes.broker_addr_table), 10, "every broker registered")
        yield cluster
