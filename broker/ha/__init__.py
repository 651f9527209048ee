"""High availability, part 1: master/slave replication of the commit log (RocketMQ's HAService).
See docs/ha.md. `wire` is the stream's codec, `sync_gate` the SYNC_MASTER wait, `master` the
master's side, `slave` the slave's, `metadata` what slaves copy besides the log."""
