"""A SYNC_FLUSH broker whose disk is slower than `sync_flush_timeout_ms`, through the producer:
the send is stored but not yet on disk, and its answer says so with the message's id, queue and
offset (FLUSH_DISK_TIMEOUT with the send's header, as RocketMQ answers), and the producer does not
send it again (RocketMQ's default `retryAnotherBrokerWhenNotStoreOK=false`). A batch past the
timeout raises `FlushDiskTimeout`, also without a resend."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from broker.broker import Broker
from client import Message, Producer
from client.api import ClientAPI, SendStatus
from protocol.errors import FlushDiskTimeout
from protocol.model import PullStatus
from tests.broker.store.conftest import Disk
from tests.conftest import broker_config
from tests.helpers import pull_header, wait_until

TIMEOUT_MS = 100


async def bodies(api: ClientAPI, broker: Broker, topic: str, queues: int = 4) -> list[tuple[int, int, bytes]]:
    """(queue id, queue offset, body) of everything stored in `topic`."""
    found: list[tuple[int, int, bytes]] = []
    for queue_id in range(queues):
        result = await api.pull_message(broker.address, pull_header(topic=topic, queue_id=queue_id, max_msg_nums=64),
                                        3_000)
        if result.status is PullStatus.FOUND:
            found += [(queue_id, m.queue_offset, m.body) for m in result.messages]
    return sorted(found)


async def test_a_send_past_its_fsync_timeout_keeps_its_header_and_is_not_resent(
        tmp_path: Path, client_api: ClientAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    config = broker_config(tmp_path)
    config = dataclasses.replace(config, store=dataclasses.replace(config.store, sync_flush_timeout_ms=TIMEOUT_MS))
    async with Broker(config) as broker:
        assert broker.store is not None and config.store.flush_disk_type == "SYNC_FLUSH"
        disk = Disk(broker.store, monkeypatch)
        async with Producer("pg", broker.address) as producer:
            fast = await producer.send(Message("slow_disk", b"fast"))      # creates the topic, learns the route
            assert fast.status is SendStatus.SEND_OK
            disk.slow(8 * TIMEOUT_MS)
            try:
                late = await producer.send(Message("slow_disk", b"late"))
                with pytest.raises(FlushDiskTimeout, match=f"not flushed within {TIMEOUT_MS} ms"):
                    await producer.send_batch([Message("slow_disk", b"batch-0"), Message("slow_disk", b"batch-1")])
            finally:
                disk.heal()
            store = broker.store
            await wait_until(lambda: store.is_durable(store.commit_log_max_offset()), timeout_s=10)
            assert (await producer.send(Message("slow_disk", b"after"))).status is SendStatus.SEND_OK
        assert late.status is SendStatus.FLUSH_DISK_TIMEOUT
        stored = await bodies(client_api, broker, "slow_disk")
        assert sorted(body for _, _, body in stored) == [b"after", b"batch-0", b"batch-1", b"fast", b"late"]
        assert (late.queue_id, late.queue_offset, b"late") in stored           # where its answer said
        found = await client_api.pull_message(broker.address, pull_header(
            topic="slow_disk", queue_id=late.queue_id, queue_offset=late.queue_offset, max_msg_nums=1), 3_000)
        assert found.messages[0].msg_id == late.msg_id and late.uniq_keys[0] == found.messages[0].uniq_key
