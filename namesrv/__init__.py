"""The rocketq name server: a stateless registry brokers register with and clients ask for routes
(RocketMQ's NameServer, REFERENCE.md §15). Depends on `protocol` and `conf` only."""
