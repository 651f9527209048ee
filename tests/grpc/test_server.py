"""`grpc_port`: validated, off at 0, a taken port fails the broker's start with a clear error (and
the broker stops what it started), the CLI says which key to change."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from broker.broker import Broker
from broker.cli import describe_start_failure
from conf.broker import BrokerConfig
from tests.conftest import broker_config
from tests.helpers import free_port


@pytest.mark.parametrize("port", [-1, 65_536, 10**9])
def test_grpc_port_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match="grpc_port"):
        BrokerConfig(grpc_port=port)


def test_the_default_is_the_proxys_port() -> None:
    assert BrokerConfig().grpc_port == 8081


async def test_zero_turns_it_off(tmp_path: Path) -> None:
    async with Broker(broker_config(tmp_path, grpc_port=0)) as broker:
        assert broker.grpc is None


async def test_a_taken_port_fails_the_start_clearly(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = broker_config(tmp_path, grpc_port=port)
        broker = Broker(config)
        with pytest.raises(OSError) as failed:
            await broker.start()
    assert failed.value.errno == errno.EADDRINUSE and failed.value.filename == "grpc_port"
    line = describe_start_failure(config, failed.value)
    assert "grpc_port" in line and str(port) in line
    assert broker.grpc is None and broker.store is None       # everything started was stopped
    async with Broker(broker_config(tmp_path, grpc_port=free_port())) as again:   # the store lock was released
        assert again.grpc is not None


async def test_settings_answers_are_small_and_the_brokers(tmp_path: Path) -> None:
    """Built afresh, not echoed: a client's lists never come back, a consumer that asks no long
    polling timeout gets 20 s, one that asks too much gets the 120 s bound."""
    from broker.grpc.proto import definition_pb2 as pb
    async with Broker(broker_config(tmp_path, grpc_port=free_port())) as broker:
        assert broker.grpc is not None
        answer_of = broker.grpc.service.settings_answer
        producer = pb.Settings(client_type=pb.PRODUCER)
        for i in range(1_500):
            producer.publishing.topics.add(name=f"topic-{i}" * 10)
        answer = answer_of(producer)
        assert answer.ByteSize() < 1024 and not answer.publishing.topics
        assert answer.publishing.max_body_size == broker.config.store.max_message_bytes
        consumer = pb.Settings(client_type=pb.PUSH_CONSUMER)
        consumer.subscription.group.name = "g"
        assert answer_of(consumer).subscription.long_polling_timeout.seconds == 20
        consumer.subscription.long_polling_timeout.seconds = 10**9
        assert answer_of(consumer).subscription.long_polling_timeout.seconds == 120
