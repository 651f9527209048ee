"""`start_replication`: the HA parts a broker runs for its `broker_role` (the composition root
calls this once its store is started, and `Replication.stop` before the store stops)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Sequence

from auth.enforcer import Enforcer
from broker.ha.master import HAServer, HAServerConfig
from broker.ha.metadata import MetadataApplier, snapshot
from broker.ha.slave import HAClient, HAClientConfig
from broker.ha.sync_gate import SyncGate
from broker.persist import Persistent
from broker.store.message_store import MessageStore
from conf.broker import BrokerConfig
from protocol.signing import Credentials, signer

log = logging.getLogger(__name__)


def ha_port(config: BrokerConfig) -> int:
    """The port a master listens on for slaves: `ha_listen_port`, or when -1 `listen_port + 1`
    (RocketMQ's default), 0 (any free port) when `listen_port` is 0."""
    if config.ha_listen_port >= 0:
        return config.ha_listen_port
    return config.listen_port + 1 if config.listen_port else 0


class Replication:
    """A master's `server` and `gate`, or a slave's `client` and `metadata` (the others None)."""

    def __init__(self, store: MessageStore, fixed_master: str = "") -> None:
        self._store = store
        self.server: HAServer | None = None
        self.gate: SyncGate | None = None
        self.client: HAClient | None = None
        self.metadata: MetadataApplier | None = None
        self.master_address = fixed_master or None    # a slave: the master's HA address when known
        self._fixed_master = bool(fixed_master)       # ha_master_address: the name servers are not followed

    @property
    def ha_address_port(self) -> int:
        return self.server.port if self.server is not None else 0

    def ha_address(self, broker_address: str) -> str:
        """A master's "host:ha_port" (the host of `broker_address`); "" for a slave."""
        if self.server is None:
            return ""
        return f"{broker_address.rpartition(':')[0]}:{self.server.port}"

    def on_master(self, master_addr: str, ha_server_addr: str) -> None:
        """A name server's answer to this broker's registration: a slave without
        `ha_master_address` follows the HA address it names (the master may have moved)."""
        if self.client is None or self._fixed_master or not ha_server_addr:
            return
        if ha_server_addr != self.master_address:
            log.info("master of this replica set: %s (replication from %s)", master_addr, ha_server_addr)
            self.master_address = ha_server_addr
            self.client.wakeup()

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.stop()
        if self.server is not None:
            await self.server.stop()
        self._store.replica_gate = None


async def start_replication(config: BrokerConfig, store: MessageStore, tables: Sequence[Persistent], *,
                            enforcer: Callable[[], Enforcer | None], credentials: Credentials | None,
                            server_tls: ssl.SSLContext | None, client_tls: ssl.SSLContext | None) -> Replication:
    """A master (ASYNC_ or SYNC_MASTER) listens for slaves on `ha_port(config)`; a SYNC_MASTER's
    store also waits on the `SyncGate` before acknowledging a send. A SLAVE refuses sends
    (SERVICE_NOT_AVAILABLE, as RocketMQ's store in slave mode) and follows its master. Raises
    `OSError` when the HA port cannot be bound."""
    replication = Replication(store, config.ha_master_address if config.is_slave else "")
    if config.is_slave:
        store.read_only = (f"this broker is a SLAVE (broker_id {config.broker_id}) of {config.broker_name}: "
                           f"send to its master")
        metadata = replication.metadata = MetadataApplier(tables)
        client = replication.client = HAClient(
            store, HAClientConfig(broker_name=config.broker_name, broker_id=config.broker_id,
                                  window_bytes=config.ha_window_bytes,
                                  housekeeping_timeout_ms=config.ha_housekeeping_timeout_ms),
            lambda: replication.master_address, sync_flush=config.store.flush_disk_type == "SYNC_FLUSH",
            apply_metadata=metadata.apply, sign=signer(credentials) if credentials is not None else None,
            tls=client_tls)
        await client.start()
        return replication
    gate = replication.gate = SyncGate(config.in_sync_replicas_min, config.ha_max_gap_bytes,
                                       config.store.sync_flush_timeout_ms, store.commit_log_max_offset)
    server = replication.server = HAServer(
        config.listen_host, ha_port(config), store, gate,
        HAServerConfig(broker_name=config.broker_name, window_bytes=config.ha_window_bytes,
                       heartbeat_interval_ms=config.ha_heartbeat_interval_ms,
                       housekeeping_timeout_ms=config.ha_housekeeping_timeout_ms,
                       metadata_interval_ms=config.ha_slave_sync_interval_ms),
        enforcer=enforcer, metadata=lambda: snapshot(tables), tls=server_tls)
    await server.start()
    if config.broker_role == "SYNC_MASTER":
        store.replica_gate = gate
    log.info("%s %s: slaves replicate from port %d", config.broker_role, config.broker_name, server.port)
    return replication
