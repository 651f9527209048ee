"""`start_replication`: the HA parts a broker runs for its role (the composition root calls this
once its store is started, and `Replication.stop` before the store stops). `Replication` switches
role in process (`become_master`, `become_slave`) when a controller decides (controller mode)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Sequence

from auth.enforcer import Enforcer
from broker.ha.epochs import EpochFile
from broker.ha.master import HAServer, HAServerConfig
from broker.ha.metadata import MetadataApplier, snapshot, version
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


def master_role(config: BrokerConfig) -> str:
    """The role this broker takes as master: `broker_role` when a master role, else (a slave
    elected by a controller) `controller_master_role`, SYNC_MASTER when unset."""
    if config.broker_role != "SLAVE":
        return config.broker_role
    return config.controller_master_role or "SYNC_MASTER"


class Replication:
    """A master's `server` and `gate`, or a slave's `client` and `metadata` (the others None).
    `epochs` in controller mode (`<store>/epochs`)."""

    def __init__(self, config: BrokerConfig, store: MessageStore, tables: Sequence[Persistent], *,
                 enforcer: Callable[[], Enforcer | None], credentials: Credentials | None,
                 server_tls: ssl.SSLContext | None, client_tls: ssl.SSLContext | None) -> None:
        self._config, self._store, self._tables = config, store, tables
        self._enforcer, self._credentials = enforcer, credentials
        self._server_tls, self._client_tls = server_tls, client_tls
        self.server: HAServer | None = None
        self.gate: SyncGate | None = None
        self.client: HAClient | None = None
        self.metadata: MetadataApplier | None = None
        fixed = config.ha_master_address if config.is_slave else ""
        self.master_address = fixed or None    # a slave: the master's HA address when known
        self._fixed_master = bool(fixed)       # ha_master_address: the name servers are not followed
        self.epochs = EpochFile(config.store.path / "epochs") if config.controller_addr else None

    @property
    def is_master(self) -> bool:
        return self.server is not None

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
        `ha_master_address` follows the HA address it names (the master may have moved). In
        controller mode the controller names the master instead (`follow`)."""
        if self.epochs is None:
            self.follow(ha_server_addr, master_addr)

    def follow(self, ha_server_addr: str, master_addr: str = "") -> None:
        """A slave replicates from `ha_server_addr` from now on (a no-op for a master)."""
        if self.client is None or self._fixed_master or not ha_server_addr:
            return
        if ha_server_addr != self.master_address:
            log.info("master of this replica set: %s (replication from %s)", master_addr, ha_server_addr)
            self.master_address = ha_server_addr
            self.client.wakeup()

    async def become_slave(self, master_ha_addr: str | None = None) -> None:
        """Stop serving slaves (if master), refuse sends, and replicate from `master_ha_addr`."""
        config, store = self._config, self._store
        await self._stop_server()
        store.read_only = (f"this broker is a SLAVE of {config.broker_name}: send to its master")
        if master_ha_addr and not self._fixed_master:
            self.master_address = master_ha_addr
        if self.client is not None:
            return
        self.metadata = MetadataApplier(self._tables)
        self.client = HAClient(
            store, HAClientConfig(broker_name=config.broker_name, broker_id=config.broker_id,
                                  window_bytes=config.ha_window_bytes,
                                  housekeeping_timeout_ms=config.ha_housekeeping_timeout_ms),
            lambda: self.master_address, sync_flush=config.store.flush_disk_type == "SYNC_FLUSH",
            apply_metadata=self.metadata.apply, sign=signer(self._credentials) if self._credentials else None,
            tls=self._client_tls, epochs=self.epochs, truncate=store.truncate_to)
        await self.client.start()

    async def become_master(self, epoch: int = 0) -> None:
        """Stop replicating (if slave), listen for slaves and take sends; a SYNC_MASTER's store
        waits on the `SyncGate`. In controller mode, `epoch` starts at this log's end. Raises
        `OSError` when the HA port cannot be bound."""
        config, store, epochs = self._config, self._store, self.epochs
        was_slave = self.client is not None
        if self.client is not None:
            await self.client.stop()
            self.client = self.metadata = None
        if self.epochs is not None and epoch > self.epochs.last_epoch:
            self.epochs.begin(epoch, store.commit_log_max_offset())
        if self.server is None:
            gate = self.gate = SyncGate(config.in_sync_replicas_min, config.ha_max_gap_bytes,
                                        config.store.sync_flush_timeout_ms, store.commit_log_max_offset)
            server = HAServer(
                config.listen_host, ha_port(config), store, gate,
                HAServerConfig(broker_name=config.broker_name, window_bytes=config.ha_window_bytes,
                               heartbeat_interval_ms=config.ha_heartbeat_interval_ms,
                               housekeeping_timeout_ms=config.ha_housekeeping_timeout_ms,
                               metadata_interval_ms=config.ha_slave_sync_interval_ms),
                enforcer=self._enforcer, metadata=lambda: snapshot(self._tables), tls=self._server_tls,
                epochs=(lambda: list(epochs.entries)) if epochs is not None else None,
                metadata_version=lambda: version(self._tables))
            await server.start()
            self.server = server
        if was_slave:
            try:
                store.take_writes()
            except OSError as exc:      # a full disk: the store refuses sends itself until it has room
                log.error("promoted with consume queues not rebuilt: %s", exc)
        role = master_role(config)
        store.replica_gate = self.gate if role == "SYNC_MASTER" else None
        store.read_only = None
        log.info("%s %s: slaves replicate from port %d%s", role, config.broker_name, self.server.port,
                 f" (epoch {epoch})" if epoch else "")

    async def _stop_server(self) -> None:
        self._store.replica_gate = None
        if self.server is not None:
            await self.server.stop()
            self.server = self.gate = None

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.stop()
        await self._stop_server()


async def start_replication(config: BrokerConfig, store: MessageStore, tables: Sequence[Persistent], *,
                            enforcer: Callable[[], Enforcer | None], credentials: Credentials | None,
                            server_tls: ssl.SSLContext | None, client_tls: ssl.SSLContext | None) -> Replication:
    """A master (ASYNC_ or SYNC_MASTER) listens for slaves on `ha_port(config)`; a SYNC_MASTER's
    store also waits on the `SyncGate` before acknowledging a send. A SLAVE refuses sends
    (SERVICE_NOT_AVAILABLE, as RocketMQ's store in slave mode) and follows its master. With
    `controller_addr` every broker starts as a slave with no master until the controller names
    one (RocketMQ 5's controller mode). Raises `OSError` when the HA port cannot be bound."""
    replication = Replication(config, store, tables, enforcer=enforcer, credentials=credentials,
                              server_tls=server_tls, client_tls=client_tls)
    if config.is_slave or config.controller_addr:
        await replication.become_slave()
    else:
        await replication.become_master()
    return replication
