"""`HACollector`: a broker's replication figures on /metrics, read at scrape time (small: one row
per slave). RocketMQ exposes the same through `HAService` runtime info (`haConnectionInfo`, the
slave ack offsets and `inSyncSlaveNums`) and the controller's epoch; here as Prometheus gauges,
with the node labels (`cluster`, `node_id`) every broker metric carries:

- `rocketq_ha_role`: 1 while this broker is a master (takes sends), 0 while a slave;
- `rocketq_ha_epoch`: the controller epoch this broker last heard (0 without a controller);
- `rocketq_ha_in_sync_replicas`: a master's replicas within `ha_max_gap_bytes`, itself included;
- `rocketq_ha_slave_ack_offset{slave}`: a master's view of each connected slave's acknowledged
  commit-log end (bytes), `slave` its broker_id;
- `rocketq_ha_slave_lag_bytes{slave}`: the master's commit-log end minus that acknowledgement;
- `rocketq_ha_master_lag_bytes`: a slave's view: the master's end as last heard minus its own
  (0 before it heard from a master)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.ha.wiring import Replication


class HACollector(Collector):
    """`replication()`: the broker's `Replication` (None before it exists or after a stop);
    `commit_log_end()`: the store's commit-log end; `epoch()`: the controller's epoch."""

    def __init__(self, labels: dict[str, str], replication: Callable[[], Replication | None],
                 commit_log_end: Callable[[], int], epoch: Callable[[], int]) -> None:
        self._labels = dict(labels)
        self._replication, self._commit_log_end, self._epoch = replication, commit_log_end, epoch

    def collect(self) -> Iterator[Metric]:
        names, values = list(self._labels), list(self._labels.values())
        replication = self._replication()
        if replication is None:
            return
        end = self._commit_log_end()
        role = GaugeMetricFamily("rocketq_ha_role", "1 while this broker is a master, 0 while a slave.", labels=names)
        role.add_metric(values, 1.0 if replication.is_master else 0.0)
        epoch = GaugeMetricFamily("rocketq_ha_epoch", "Controller epoch last heard (0: no controller).", labels=names)
        epoch.add_metric(values, float(self._epoch()))
        yield role
        yield epoch
        server, client = replication.server, replication.client
        if server is not None:
            gate = server.gate
            in_sync = GaugeMetricFamily("rocketq_ha_in_sync_replicas",
                                        "Replicas within ha_max_gap_bytes of the master, the master included.",
                                        labels=names)
            in_sync.add_metric(values, float(1 + len(server.in_sync_slaves())))
            acked = GaugeMetricFamily("rocketq_ha_slave_ack_offset",
                                      "Commit-log end (bytes) each connected slave acknowledged.",
                                      labels=[*names, "slave"])
            lag = GaugeMetricFamily("rocketq_ha_slave_lag_bytes",
                                    "Master commit-log end minus each connected slave's acknowledgement.",
                                    labels=[*names, "slave"])
            for connection_id, slave_id in sorted(gate.slave_ids.items()):
                offset = gate.acks.get(connection_id, 0)
                acked.add_metric([*values, str(slave_id)], float(offset))
                lag.add_metric([*values, str(slave_id)], float(max(end - offset, 0)))
            yield in_sync
            yield acked
            yield lag
        if client is not None:
            behind = GaugeMetricFamily("rocketq_ha_master_lag_bytes",
                                       "A slave: the master's commit-log end as last heard minus its own.",
                                       labels=names)
            behind.add_metric(values, float(max(client.master_offset - end, 0)))
            yield behind
