"""Timer messages through a real broker: delivered no earlier than their time and soon after it,
refused clearly when hostile, through restarts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgpack
import pytest

from broker.broker import Broker
from broker.processors.send_message import decode_batch, decode_batch_py
from client.api import ClientAPI
from protocol.errors import MessageIllegal, NoPermission
from protocol.model import PullStatus
from protocol.topics import TIMER_TOPIC
from tests.conftest import broker_config
from tests.helpers import pull_header, send


async def pull_all(api: ClientAPI, address: str, topic: str, count: int, timeout_s: float,
                   queue_id: int = 0) -> list[tuple[bytes, dict[str, str], float]]:
    """(body, properties, received at: time.time()) of `count` messages of `topic`:`queue_id`."""
    got: list[tuple[bytes, dict[str, str], float]] = []
    offset = 0
    async with asyncio.timeout(timeout_s):
        while len(got) < count:
            result = await api.pull_message(address, pull_header(topic=topic, queue_id=queue_id, queue_offset=offset,
                                                                 suspend_timeout_ms=1_000, max_msg_nums=256), 5_000)
            now = time.time()
            if result.status is PullStatus.FOUND:
                got += [(m.body, m.properties, now) for m in result.messages]
            offset = result.next_begin_offset
    return got


async def test_a_timer_message_arrives_at_its_time_not_before(broker: Broker, client_api: ClientAPI) -> None:
    due = int(time.time() * 1000) + 700
    await send(client_api, broker.address, "t", b"later", properties={"TIMER_DELIVER_MS": str(due)})
    await send(client_api, broker.address, "t", b"now")
    [(body, _, _), (later, properties, received_at)] = await pull_all(client_api, broker.address, "t", 2, 5)
    assert (body, later) == (b"now", b"later")
    assert due <= received_at * 1000 < due + 500
    assert not any(key.startswith("TIMER_") for key in properties)
    assert properties["REAL_TOPIC"] == "t"


async def test_delay_ms_and_delay_sec_are_relative_to_the_send(broker: Broker, client_api: ClientAPI) -> None:
    sent = time.time()
    await send(client_api, broker.address, "t", b"ms", properties={"TIMER_DELAY_MS": "300"})
    await send(client_api, broker.address, "t", b"sec", properties={"TIMER_DELAY_SEC": "1"})
    got = await pull_all(client_api, broker.address, "t", 2, 5)
    assert [body for body, _, _ in got] == [b"ms", b"sec"]
    assert got[0][2] - sent >= 0.3 and got[1][2] - sent >= 1.0


async def test_past_due_times_are_stored_at_once(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "t", b"past", properties={"TIMER_DELIVER_MS": "1000"})
    [(body, properties, _)] = await pull_all(client_api, broker.address, "t", 1, 2)
    assert body == b"past" and "TIMER_DELIVER_MS" not in properties
    assert broker.store is not None and broker.store.get_max_offset(TIMER_TOPIC, 0) == 0


@pytest.mark.parametrize(("key", "value", "remark"), [
    ("TIMER_DELIVER_MS", "-5", "not negative"),
    ("TIMER_DELIVER_MS", "soon", "must be an integer"),
    ("TIMER_DELIVER_MS", "1.5e12", "must be an integer"),
    ("TIMER_DELIVER_MS", "9" * 40, "must be an integer"),
    ("TIMER_DELIVER_MS", str(2**63 - 1), "beyond timer_max_delay_sec"),
    ("TIMER_DELAY_MS", "-1", "must not be negative"),
    ("TIMER_DELAY_MS", str(259_200_000 + 60_000), "beyond timer_max_delay_sec"),
    ("TIMER_DELAY_SEC", str(10**18), "beyond timer_max_delay_sec"),
    ("TIMER_DELAY_SEC", "", "must be an integer"),
])
async def test_hostile_timer_values_are_refused_clearly(broker: Broker, client_api: ClientAPI, key: str,
                                                        value: str, remark: str) -> None:
    with pytest.raises(MessageIllegal, match=remark):
        await send(client_api, broker.address, "t", b"x", properties={key: value})
    assert broker.store is not None and broker.store.get_max_offset("t", 0) == 0


async def test_beyond_timer_max_delay_sec_is_refused(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, timer_max_delay_sec=60)) as broker:
        due = int(time.time() * 1000) + 61_000
        with pytest.raises(MessageIllegal, match=r"beyond timer_max_delay_sec \(60 s\)"):
            await send(client_api, broker.address, "t", b"x", properties={"TIMER_DELIVER_MS": str(due)})
        await send(client_api, broker.address, "t", b"ok", properties={"TIMER_DELAY_SEC": "59"})
        assert broker.store is not None and broker.store.get_max_offset(TIMER_TOPIC, 0) == 1


async def test_the_timer_topic_is_not_sendable(broker: Broker, client_api: ClientAPI) -> None:
    with pytest.raises(NoPermission, match="TIMER_DELIVER_MS"):
        await send(client_api, broker.address, TIMER_TOPIC, b"x")


async def test_a_delay_level_wins_over_timer_properties(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "t", b"x", properties={"DELAY": "1", "TIMER_DELIVER_MS": "garbage"})
    [(body, properties, _)] = await pull_all(client_api, broker.address, "t", 1, 3)
    assert body == b"x" and "TIMER_DELIVER_MS" not in properties


async def test_a_delay_level_of_zero_leaves_the_timer_in_charge(broker: Broker, client_api: ClientAPI) -> None:
    due = int(time.time() * 1000) + 400
    await send(client_api, broker.address, "t", b"x", properties={"DELAY": "0", "TIMER_DELIVER_MS": str(due)})
    [(_, _, received_at)] = await pull_all(client_api, broker.address, "t", 1, 3)
    assert received_at * 1000 >= due


@pytest.mark.parametrize("key", ["TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC"])
def test_a_batch_with_a_timer_property_is_refused_by_both_decoders(key: str) -> None:
    body = msgpack.packb([[{"a": "b"}, 0, b"x"], [{key: "5"}, 0, b"y"]])
    for decode in (decode_batch, decode_batch_py):
        with pytest.raises(MessageIllegal, match="batch message 1 is a timer message"):
            decode(body, 1 << 20)
