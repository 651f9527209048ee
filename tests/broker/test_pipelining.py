"""Pipelined requests on one connection (`max_requests_per_step`): a burst is stored and answered
in the order sent, a chunk per loop step, and other connections are served between the chunks."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from bench.inproc_harness import send_frame
from broker.broker import Broker
from conf import BrokerConfig, ConfigError, load
from conf.store import FlushDiskType
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.frame import encode_frame_bytes
from tests.broker.store.conftest import decoded
from tests.conftest import broker_config
from tests.helpers import read_commands

WAIT_S = 5
BURST = 200


def send_frames(topic: str, count: int) -> bytes:
    """`count` SEND_MESSAGE requests to queue 0 of `topic`, opaque i and body b"i", as one write."""
    return b"".join(send_frame(topic, 0, i, b"%d" % i) for i in range(count))


def config_with(tmp_path: Path, flush_disk_type: FlushDiskType) -> BrokerConfig:
    config = broker_config(tmp_path, max_requests_per_step=4)
    return dataclasses.replace(config, store=dataclasses.replace(config.store, flush_disk_type=flush_disk_type))


@pytest.mark.parametrize("flush_disk_type", ["ASYNC_FLUSH", "SYNC_FLUSH"])
async def test_a_burst_of_pipelined_sends_is_stored_and_answered_in_order(tmp_path: Path,
                                                                          flush_disk_type: FlushDiskType) -> None:
    async with Broker(config_with(tmp_path, flush_disk_type)) as broker:
        host, port = broker.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            async with asyncio.timeout(WAIT_S):
                writer.write(send_frames("burst", BURST))
                answers = await read_commands(reader, BURST)
        finally:
            writer.close()
        assert [a.opaque for a in answers] == list(range(BURST))
        assert {a.code for a in answers} == {ResponseCode.SUCCESS}
        assert [a.fields["queue_offset"] for a in answers] == list(range(BURST))    # stored in the order sent
        assert broker.store is not None
        bodies: list[bytes] = []
        while len(bodies) < BURST:          # 32 messages per read at most
            read = decoded(broker.store.get_message("burst", 0, len(bodies), BURST, None))
            assert read, f"nothing stored at queue offset {len(bodies)}"
            bodies += [m.body for m in read]
        assert bodies == [b"%d" % i for i in range(BURST)]


async def test_another_connection_is_served_between_the_chunks_of_a_burst(tmp_path: Path) -> None:
    """While a 200-send burst on one connection is handled four at a time, a request on a second
    connection, written once the burst's first answers are back, is answered before its last.
    ASYNC_FLUSH: the first answers come after the first chunk, not after a first fsync (which a
    slow disk could make last longer than the whole burst)."""
    async with Broker(config_with(tmp_path, "ASYNC_FLUSH")) as broker:
        # The topic exists first: sends to a topic being created all wait for its config's write.
        broker.topics.ensure("burst", 4)
        await broker.topics.wait_durable()
        host, port = broker.address.rsplit(":", 1)
        burst_reader, burst_writer = await asyncio.open_connection(host, int(port))
        other_reader, other_writer = await asyncio.open_connection(host, int(port))
        try:
            async with asyncio.timeout(WAIT_S):
                burst_writer.write(send_frames("burst", BURST))
                first = await read_commands(burst_reader, 1)
                probe = RemotingCommand(int(RequestCode.GET_MAX_OFFSET), opaque=7,
                                        fields={"topic": "burst", "queue_id": 0})
                other_writer.write(encode_frame_bytes(probe))
                (answer,) = await read_commands(other_reader, 1)
                rest = await read_commands(burst_reader, BURST - len(first))
        finally:
            burst_writer.close()
            other_writer.close()
        assert answer.code == ResponseCode.SUCCESS
        assert 0 < answer.fields["offset"] < BURST, "the probe waited for the whole burst"
        assert [a.opaque for a in first + rest] == list(range(BURST))


def test_max_requests_per_step_is_checked_and_documented(tmp_path: Path) -> None:
    assert BrokerConfig().max_requests_per_step == 8
    assert BrokerConfig(max_requests_per_step=0).max_requests_per_step == 0      # no bound
    with pytest.raises(ConfigError, match="max_requests_per_step"):
        load(BrokerConfig, overrides={"max_requests_per_step": "-1"})
