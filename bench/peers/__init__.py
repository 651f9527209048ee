"""rocketq measured against Redis Streams (redis-py asyncio + hiredis) on the same workloads, in one
run, alternating between the two: sends one at a time and batched, a single consumer of a backlog,
4 consumers end to end, wake latency, and 10,000 idle blocked readers.

    .venv/bin/python -m bench.peers [--quick]      # or: make bench-peers

Pairings: rocketq ASYNC_FLUSH against Redis without persistence ("in-memory"), rocketq SYNC_FLUSH
against Redis with `appendfsync always` ("durable")."""
