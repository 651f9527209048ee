"""Pure parts of replication: the stream codec, the commit log's replication chunks (any window
reassembles the same bytes at the same offsets), and the SYNC_MASTER gate's bookkeeping."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ha.sync_gate import SyncGate
from broker.ha.wire import (
    HAProtocolError,
    Hello,
    hello_command,
    parse_hello,
    parse_transfer_header,
    transfer_header,
)
from broker.store.commit_log import CommitLog
from broker.store.record import encode_record
from protocol.errors import FlushSlaveTimeout, SlaveNotAvailable
from protocol.frame import FrameDecoder, encode_frame_bytes

_EPOCHS = st.none() | st.lists(st.tuples(st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1)),
                               max_size=20).map(tuple)


@given(st.text(max_size=40), st.integers(0, 1_000), st.integers(0, (1 << 63) - 1), _EPOCHS)
def test_hello_round_trips_through_a_frame(name: str, broker_id: int, max_offset: int,
                                           epochs: tuple[tuple[int, int], ...] | None) -> None:
    wire = encode_frame_bytes(hello_command(Hello(name, broker_id, max_offset, epochs)))
    (command,) = FrameDecoder(max_frame_bytes=1 << 16).feed(wire)
    assert parse_hello(command) == Hello(name, broker_id, max_offset, epochs)


@given(st.dictionaries(st.sampled_from(["broker_name", "broker_id", "max_offset", "epochs", "x"]),
                       st.one_of(st.integers(-(1 << 64), 1 << 64), st.text(max_size=5), st.none(),
                                 st.lists(st.lists(st.integers(-(1 << 64), 1 << 64), max_size=3), max_size=3))))
def test_a_bad_hello_raises_only_the_protocol_error(fields: dict[str, object]) -> None:
    command = hello_command(Hello("a", 1, 0))
    command.fields.clear()
    command.fields.update(fields)
    try:
        hello = parse_hello(command)
    except HAProtocolError:
        return
    assert 0 <= hello.broker_id <= 1_000 and hello.max_offset >= 0


@given(st.integers(0, 255), st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 32) - 1))
def test_transfer_headers_decode_or_raise(kind: int, offset: int, length: int) -> None:
    data = transfer_header(kind, offset, length)
    try:
        assert parse_transfer_header(data, 1 << 20) == (kind, offset, length)
    except HAProtocolError:
        assert kind not in (0, 1, 2) or offset >= 1 << 63 or length > 1 << 20


def _log_with(path: Path, sizes: list[int], segment_bytes: int) -> CommitLog:
    log = CommitLog(path, segment_bytes)
    log.load()
    log.recover(0, deep=False)
    for index, size in enumerate(sizes):
        payload = bytes([index % 251]) * size

        def encode(_commit_log_offset: int, payload: bytes = payload) -> bytes:
            return payload
        assert log.append_one(encode) is not None
    return log


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=60), st.integers(1, 3_000))
def test_any_window_replicates_the_same_bytes(tmp_path_factory: pytest.TempPathFactory, sizes: list[int],
                                              window: int) -> None:
    root = tmp_path_factory.mktemp("log")
    master = _log_with(root / "master", sizes, 4_096)       # small files: records roll, zero tails
    slave = CommitLog(root / "slave", 4_096)
    slave.load()
    slave.recover(0, deep=False)
    try:
        position = 0
        while (chunk := master.replication_chunk(position, window)) is not None:
            offset, data = chunk
            assert offset >= position and len(data) > 0
            slave.append_replicated(offset, bytes(data))
            position = offset + len(data)
        assert slave.max_offset == master.max_offset
        def records(log: CommitLog) -> list[tuple[int, int, bytes]]:
            return [(offset, size, bytes(payload)) for offset, size, payload in log.records(0, log.max_offset)]
        assert records(slave) == records(master) and len(records(master)) == len(sizes)
        with pytest.raises(ValueError):                    # nothing before the slave's end is rewritten
            slave.append_replicated(0, encode_record(b"x"))
    finally:
        master.close()
        slave.close()


class _Future:
    def __init__(self) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.finished = False

    def done(self) -> bool:
        return self.finished

    def set_result(self, value: object, /) -> None:
        self.result, self.finished = value, True

    def set_exception(self, exc: BaseException, /) -> None:
        self.error, self.finished = exc, True


async def test_gate_acks_a_send_once_enough_slaves_have_it() -> None:
    master_end = [1_000]
    gate = SyncGate(3, 500, 60_000, lambda: master_end[0])      # the master and two slaves
    gate.acknowledged(1, 900)
    early = _Future()
    gate.resolve_when_acked(1_000, early, "r")
    assert isinstance(early.error, SlaveNotAvailable)            # one slave in sync, two needed
    gate.acknowledged(2, 800)
    waiting = [_Future() for _ in range(3)]
    for end, future in zip((950, 980, 1_000), waiting, strict=True):
        gate.resolve_when_acked(end, future, end)
    gate.acknowledged(1, 1_000)
    assert not any(f.done() for f in waiting)                    # the second slave is at 800
    gate.acknowledged(2, 980)
    assert [f.result for f in waiting] == [950, 980, None]       # one ack covers every send before it
    master_end[0] = 1_490                       # slave 2 now 510 behind (> ha_max_gap_bytes): out of sync
    assert gate.in_sync() == [1_000]
    gate.close()
    assert isinstance(waiting[2].error, FlushSlaveTimeout)


async def test_gate_times_out_a_send_the_slaves_never_confirm() -> None:
    gate = SyncGate(2, 1 << 20, 50, lambda: 100)
    gate.acknowledged(7, 0)
    future = _Future()
    gate.resolve_when_acked(100, future, "r")
    async with asyncio.timeout(2):
        while not future.done():
            await asyncio.sleep(0.01)
    assert isinstance(future.error, FlushSlaveTimeout)
    gate.disconnected(7)
    assert gate.in_sync() == []


@pytest.mark.parametrize(("overrides", "message"), [
    ({"broker_role": "SLAVE"}, "SLAVE needs broker_id >= 1"),
    ({"broker_role": "SYNC_MASTER", "broker_id": 2}, "needs broker_id 0"),
    ({"broker_role": "MASTER"}, "ASYNC_MASTER, SYNC_MASTER or SLAVE"),
    ({"broker_role": "SLAVE", "broker_id": 1, "ha_master_address": "nohost"}, "host:port"),
    ({"in_sync_replicas_min": 0}, "in_sync_replicas_min"),
])
def test_contradicting_roles_do_not_start(overrides: dict[str, object], message: str) -> None:
    from conf.broker import BrokerConfig
    with pytest.raises(ValueError, match=message):
        BrokerConfig(**overrides)  # type: ignore[arg-type]
