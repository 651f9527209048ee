"""The pull status table (REFERENCE.md §2.1/§2.3) as a client sees it over TCP."""

from __future__ import annotations

import pytest

from broker.broker import Broker
from broker.processors.pull_message import response_fields
from broker.store.results import GetMessageResult, GetMessageStatus
from client.api import ClientAPI
from protocol.errors import MessageIllegal, ResponseError, SystemError_, TopicNotExist
from protocol.headers import PullMessageResponseHeader
from protocol.model import PullStatus
from tests.helpers import pull_header, send


async def _pull(api: ClientAPI, broker: Broker, **kw: object) -> tuple[PullStatus, int, int, int]:
    r = await api.pull_message(broker.address, pull_header(**kw), 3_000)  # type: ignore[arg-type]
    return r.status, r.next_begin_offset, r.min_offset, r.max_offset


async def test_empty_queue(broker: Broker, client_api: ClientAPI) -> None:
    await send(client_api, broker.address, "e", queue_id=1)          # creates the topic; queue 0 stays empty
    assert await _pull(client_api, broker, topic="e", queue_offset=0) == (PullStatus.NO_NEW_MSG, 0, 0, 0)
    assert await _pull(client_api, broker, topic="e", queue_offset=7) == (PullStatus.OFFSET_ILLEGAL, 0, 0, 0)


async def test_offsets_at_and_past_the_end(broker: Broker, client_api: ClientAPI) -> None:
    for _ in range(3):
        await send(client_api, broker.address, "s")
    assert await _pull(client_api, broker, topic="s", queue_offset=3) == (PullStatus.NO_NEW_MSG, 3, 0, 3)
    # OFFSET_OVERFLOW_BADLY corrects to the max offset (4.9.4+ rule, PROTOCOL.md difference 7).
    assert await _pull(client_api, broker, topic="s", queue_offset=10) == (PullStatus.OFFSET_ILLEGAL, 3, 0, 3)
    assert await _pull(client_api, broker, topic="s", queue_offset=1) == (PullStatus.FOUND, 3, 0, 3)


async def test_filtered_out_messages_advance_next_begin_offset(broker: Broker, client_api: ClientAPI) -> None:
    for _ in range(4):
        await send(client_api, broker.address, "f", tags="B")
    await send(client_api, broker.address, "f", b"a", tags="A")
    assert await _pull(client_api, broker, topic="f", subscription="C") == (PullStatus.NO_MATCHED_MSG, 5, 0, 5)
    result = await client_api.pull_message(broker.address, pull_header(topic="f", subscription="A || C"), 3_000)
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"a"]
    assert result.next_begin_offset == 5


async def test_errors(broker: Broker, client_api: ClientAPI) -> None:
    with pytest.raises(TopicNotExist):
        await _pull(client_api, broker, topic="missing")
    await send(client_api, broker.address, "q")
    with pytest.raises(SystemError_, match="queue_id 9"):
        await _pull(client_api, broker, topic="q", queue_id=9)
    with pytest.raises(MessageIllegal, match="queue_offset"):     # a header integer out of range: 13
        await _pull(client_api, broker, topic="q", queue_offset=-1)
    with pytest.raises(ResponseError, match="SUBSCRIPTION_PARSE_FAILED"):
        await _pull(client_api, broker, topic="q", subscription="||")
    with pytest.raises(ResponseError, match="SUBSCRIPTION_NOT_EXIST"):
        await _pull(client_api, broker, topic="q", sys_flag=0)     # no heartbeat, no SUBSCRIPTION flag


def test_pull_response_fields_are_the_response_header() -> None:
    result = GetMessageResult(GetMessageStatus.FOUND, [], 5, 1, 9, 0, 0)
    assert response_fields(result) == PullMessageResponseHeader(
        next_begin_offset=5, min_offset=1, max_offset=9, suggest_which_broker_id=0).to_fields()
