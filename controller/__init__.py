"""The controller: automatic master election for replica sets (RocketMQ 5's controller mode).
See docs/ha.md "Automatic failover". `state` is the pure replicated state, `raft` its agreement
among 1 or 3 controllers (pysyncobj), `server` the request handling and the election scan."""
