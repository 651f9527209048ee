"""`Broker.connection_protocol`: a connection handed its own transport is served as an accepted
TCP one (what `bench.inproc` relies on to measure the broker in process)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bench.inproc import main as inproc_main
from bench.inproc_harness import DroppingTransport
from broker.broker import Broker
from client.api import ClientAPI
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.frame import FrameDecoder, encode_frame_bytes
from protocol.model import PullStatus
from tests.conftest import broker_config
from tests.helpers import pull_header, send


class CollectingTransport(DroppingTransport):
    """`bench.inproc`'s transport, keeping what is written."""

    def __init__(self) -> None:
        super().__init__(40_000)
        self.written = bytearray()
        self.wrote = asyncio.Event()

    def write(self, data: Any) -> None:
        super().write(data)
        self.written += data
        self.wrote.set()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)


async def test_a_send_fed_to_a_connection_protocol_is_stored_and_answered(broker: Broker,
                                                                         client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "cp")                      # topic exists, offset 0 taken
    transport = CollectingTransport()
    protocol = broker.connection_protocol()
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    fields = {"producer_group": "pg", "topic": "cp", "queue_id": 0, "flag": 0, "born_timestamp": 0,
              "properties": {}, "reconsume_times": 0, "max_reconsume_times": None}
    protocol.data_received(encode_frame_bytes(RemotingCommand(int(RequestCode.SEND_MESSAGE), opaque=7,
                                                              fields=fields, body=b"in process")))
    await asyncio.wait_for(transport.wrote.wait(), 5)                 # SYNC_FLUSH: after the fsync
    [response] = FrameDecoder().feed(bytes(transport.written))
    assert (response.code, response.opaque, response.fields["queue_offset"]) == (ResponseCode.SUCCESS, 7, 1)
    pulled = await client_api.pull_message(broker.address, pull_header(topic="cp", queue_offset=1), 5_000)
    assert pulled.status is PullStatus.FOUND and [m.body for m in pulled.messages] == [b"in process"]


async def test_no_connection_protocol_before_the_broker_starts(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not started"):
        Broker(broker_config(tmp_path)).connection_protocol()


@pytest.mark.parametrize(("workload", "reported"), [
    ("send", "µs of broker CPU per SEND"), ("batch", "µs of broker CPU per SEND"),
    ("wake-one", "µs of broker CPU per SEND waking one held pull"),
    ("consume", "µs of broker CPU per message consumed"),
    ("wake-all", "ms of broker CPU for 1,000 sends waking 10,000 pulls")])
def test_the_in_process_benchmarks_run(workload: str, reported: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench.inproc` (a smoke run: `wake-one` and `consume` raise unless each SEND answers its held
    pull within its own handling, `wake-all` unless every pull is held, then answered)."""
    assert inproc_main([workload, "--rounds", "1", "--count", "64"]) == 0
    assert reported in capsys.readouterr().out
