"""The client's fallback resend of a failed message (when CONSUMER_SEND_MSG_BACK is refused) keeps
`reconsume_times` within the header's int32 range: a message stored with 2**64 - 1 by an older
broker used to make the resend raise OverflowError (msgpack), so it was retried locally for good."""

from __future__ import annotations

from broker.broker import Broker
from client.api import ClientAPI
from client.consumer.send_back import SendBack
from protocol.message import MessageExt
from protocol.model import MessageQueue
from tests.helpers import pull_header, send


async def test_a_resend_past_int32_goes_to_the_dlq_instead_of_failing(broker: Broker, client_api: ClientAPI) -> None:
    sent = await send(client_api, broker.address, "worn")
    message = MessageExt(topic="worn", body=b"worn", queue_id=0, queue_offset=0, reconsume_times=2**64 - 1,
                         commit_log_offset=int(sent.msg_id[16:], 16) + 3,    # no record there: send-back refused
                         msg_id=sent.msg_id)
    send_back = SendBack(client_api, lambda mq: broker.address, "g", -1, timeout_ms=3_000)
    assert await send_back(message, MessageQueue("worn", broker.config.broker_name, 0), 0)
    assert send_back.fallback_sent == 1
    result = await client_api.pull_message(broker.address, pull_header(topic="%DLQ%g", group="dlq-reader"), 3_000)
    assert [m.body for m in result.messages] == [b"worn"]
    assert result.messages[0].reconsume_times == 2**31 - 1
